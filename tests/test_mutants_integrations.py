"""valuelab.integrations' shared pieces, entry by entry: the hole conventions and the swap/argument helpers.

Written for the mutation score (tools/mutation_score.py): each behaviour
the adapters rely on is pinned here, messages included (an adapter whose
error names the wrong argument is a slip too). The adapters themselves are
tested against the trainers in tests/test_integrations.py and
tests/test_torchrl_gae.py.
"""

from __future__ import annotations

import types

import pytest
import torch

from valuelab.integrations import HOLE_CONVENTIONS, carry_into_holes, hole_convention, zero_holes
from valuelab.integrations import _swap
from valuelab.integrations import verl as verl_adapter

# ---------------------------------------------------------------------------
# hole conventions
# ---------------------------------------------------------------------------


def test_hole_convention_names_and_words():
    assert tuple(HOLE_CONVENTIONS) == ("skip", "zero")
    assert hole_convention("skip") == HOLE_CONVENTIONS["skip"] and hole_convention("zero") == HOLE_CONVENTIONS["zero"]
    assert hole_convention("skip").startswith("a masked position is skipped: the recursion jumps")
    assert "(valuelab.gae; verl since PR 2337)" in hole_convention("skip")
    assert hole_convention("zero").startswith("a masked position is a token with reward 0 and value 0")
    assert "(OpenRLHF's get_advantages_and_returns)" in hole_convention("zero")
    with pytest.raises(ValueError, match=r"^name must be one of \('skip', 'zero'\), got 'carry'$"):
        hole_convention("carry")


def test_zero_holes():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
    m = torch.tensor([[True, False, True], [False, False, True]])
    out = zero_holes(x, m)
    assert out.tolist() == [[1.0, 0.0, 3.0], [0.0, 0.0, 6.0]] and out.dtype == torch.float64
    assert zero_holes(x, m.double()).tolist() == out.tolist()  # a 0/1 float mask too
    assert zero_holes(x.float(), m).dtype == torch.float32
    with pytest.raises(TypeError, match=r"^x must be a torch\.Tensor, got list$"):
        zero_holes([1.0], m)
    with pytest.raises(ValueError, match=r"^mask must have shape \(2, 3\), got \(3,\)$"):
        zero_holes(x, torch.ones(3, dtype=torch.bool))


def test_carry_into_holes():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0], [6.0, 7.0, 8.0, 9.0, 10.0]], dtype=torch.float64)
    m = torch.tensor([[True, False, False, True, False], [False, True, True, False, True]])
    out = carry_into_holes(x, m)  # a masked entry takes the next valid value to its right, 0 after the last one
    assert out.tolist() == [[1.0, 4.0, 4.0, 4.0, 0.0], [7.0, 7.0, 8.0, 10.0, 10.0]]
    assert out.dtype == torch.float64
    one = carry_into_holes(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([False, True, False]))  # 1-D
    assert one.tolist() == [2.0, 2.0, 0.0] and one.dtype == torch.float32
    assert carry_into_holes(x, torch.zeros_like(m)).tolist() == [[0.0] * 5] * 2
    assert carry_into_holes(x, torch.ones_like(m)).tolist() == x.tolist()
    with pytest.raises(TypeError, match=r"^x must be a torch\.Tensor, got list$"):
        carry_into_holes([1.0], m)
    with pytest.raises(ValueError, match=r"^mask must have shape \(2, 5\), got \(5,\)$"):
        carry_into_holes(x, torch.ones(5, dtype=torch.bool))


# ---------------------------------------------------------------------------
# swap and installed
# ---------------------------------------------------------------------------


def _new(x):
    return ("new", x)


def _old(x):
    return ("old", x)


def test_swap_is_idempotent_and_restores_the_original():
    mod = types.ModuleType("trainer")
    mod.fn = _old
    registry = {"gae": _old, "other": 1}
    restore = _swap.swap(mod, "fn", _new, registry=registry, key="gae")
    assert mod.fn is _new and registry["gae"] is _new and registry["other"] == 1
    assert _swap.installed(mod, "fn", _new) and not _swap.installed(mod, "fn", _old)
    assert vars(mod)["_valuelab_originals"] == {"fn": _old, ("registry", "gae"): _old}
    again = _swap.swap(mod, "fn", _new, registry=registry, key="gae")  # a second install keeps the first originals
    assert vars(mod)["_valuelab_originals"] == {"fn": _old, ("registry", "gae"): _old}
    again()
    assert mod.fn is _old and registry["gae"] is _old
    restore()
    assert mod.fn is _old and registry["gae"] is _old
    # without a registry, and a registry key that was absent: restored to None
    plain = types.ModuleType("plain")
    plain.fn = _old
    back = _swap.swap(plain, "fn", _new)
    assert plain.fn is _new
    back()
    assert plain.fn is _old and "_valuelab_originals" in vars(plain)
    empty = {}
    back = _swap.swap(plain, "fn", _new, registry=empty, key="gae")
    assert empty == {"gae": _new}
    back()
    assert empty == {"gae": None} and plain.fn is _old
    with pytest.raises(TypeError, match=r"^<module 'plain'> has no attribute 'missing': not the trainer object this adapter "
                                        r"patches$"):
        _swap.swap(plain, "missing", _new)


def test_swap_on_a_class_keeps_the_class_own_attribute():
    class Base:
        def method(self):
            return "base"

    class Maker(Base):
        pass

    back = _swap.swap(Maker, "method", lambda self: "ours")
    assert Maker().method() == "ours" and Base().method() == "base"
    assert _swap.installed(Maker, "method", vars(Maker)["method"])
    back()
    assert Maker().method() == "base"
    assert not _swap.installed(Maker, "nothing", _new)


# ---------------------------------------------------------------------------
# rate, promoted, refuse_nonfinite
# ---------------------------------------------------------------------------


def test_rate_accepts_numbers_scalars_and_rows():
    assert _swap.rate(0.5, "gamma", 3, per_row=False) == 0.5 and isinstance(_swap.rate(1, "gamma", 3, per_row=False), float)
    assert _swap.rate(0, "lam", 3, per_row=True) == 0.0 and _swap.rate(1.0, "lam", 3, per_row=True) == 1.0
    assert _swap.rate(torch.tensor(0.25), "gamma", 3, per_row=False) == 0.25
    assert _swap.rate(torch.tensor(0.25, dtype=torch.float64), "gamma", 3, per_row=True) == 0.25
    rows = torch.tensor([0.0, 0.5, 1.0], requires_grad=True)
    out = _swap.rate(rows, "lam", 3, per_row=True)
    assert out.shape == (3, 1) and out.tolist() == [[0.0], [0.5], [1.0]] and not out.requires_grad


@pytest.mark.parametrize(
    "x, per_row, error, message",
    [
        (True, False, TypeError, "gamma must be a real number or a float tensor, not bool"),
        (torch.tensor(True), False, TypeError, "gamma must be a real number or a float tensor, not bool"),
        ("0.9", False, TypeError, "gamma must be a real number or a float tensor, got str"),
        (torch.tensor(1), False, TypeError, "gamma must be a float tensor, got torch.int64"),
        (1.5, False, ValueError, "gamma must lie in [0, 1], got 1.5"),
        (-0.5, True, ValueError, "gamma must lie in [0, 1], got -0.5"),
        (float("nan"), False, ValueError, "gamma must lie in [0, 1], got nan"),
        (torch.tensor(1.5), False, ValueError, "gamma must lie in [0, 1], got 1.5"),
        (10 ** 400, False, ValueError, "gamma must be finite: " + str(10 ** 400)[:40] + " is too large for a float"),
        (torch.tensor([0.5, 1.5, 0.5]), True, ValueError, "gamma must lie in [0, 1]"),
        (torch.tensor([0.5, -0.5, 0.5]), True, ValueError, "gamma must lie in [0, 1]"),
        (torch.tensor([0.5, float("nan"), 0.5]), True, ValueError, "gamma must lie in [0, 1]"),
        (torch.tensor([0.5, 0.5, 0.5]), False, ValueError, "gamma must be a number or a 0-d tensor; got shape (3,)"),
        (torch.tensor([0.5, 0.5]), True, ValueError, "gamma must be a number or a 0-d tensor or shape (3,), one per row; got shape (2,)"),
        (torch.tensor([[0.5, 0.5, 0.5]]), True, ValueError,
         "gamma must be a number or a 0-d tensor or shape (3,), one per row; got shape (1, 3)"),
        (torch.tensor([0.5, 0.5, 0.5]).to_sparse(), True, TypeError, "gamma must be a dense (strided) tensor, got layout torch.sparse_coo"),
    ],
)
def test_rate_refusals(x, per_row, error, message):
    import re

    with pytest.raises(error, match="^" + re.escape(message) + "$"):
        _swap.rate(x, "gamma", 3, per_row=per_row)


def test_promoted():
    f32, f64 = torch.zeros(2, dtype=torch.float32), torch.zeros(2, dtype=torch.float64)
    bf, half = torch.zeros(2, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.float16)
    dtype, (a, b) = _swap.promoted(("r", f32), ("v", f64))
    assert dtype == torch.float64 and a.dtype == torch.float64 and b.dtype == torch.float64
    dtype, (a, b) = _swap.promoted(("r", f32), ("v", bf))
    assert dtype == torch.float32 and a.dtype == b.dtype == torch.float32
    dtype, (a, b) = _swap.promoted(("r", bf), ("v", bf))
    assert dtype == torch.bfloat16 and a.dtype == b.dtype == torch.float32  # half precision: computed in float32
    dtype, (a, b, c) = _swap.promoted(("r", half), ("v", half), ("w", bf))
    assert dtype == torch.float32 and a.dtype == torch.float32
    dtype, (a,) = _swap.promoted(("r", half))
    assert dtype == torch.float16 and a.dtype == torch.float32
    meta = torch.zeros(2, device="meta")
    with pytest.raises(ValueError, match=r"^v must be on the device of r \(cpu\), got meta$"):
        _swap.promoted(("r", f32), ("v", meta))


def test_refuse_nonfinite():
    ok = torch.tensor([[1.0, 2.0]])
    _swap.refuse_nonfinite(ok, "values", None, "verl")
    bad = torch.tensor([[1.0, float("nan")]])
    tail = ("'s loop multiplies by the mask and NaN * 0 is NaN, so verl would return NaN advantages for the row; "
            "valuelab refuses. Zero the entries first (valuelab.integrations.zero_holes).")
    import re

    with pytest.raises(ValueError, match="^" + re.escape("values holds NaN or inf (at masked positions only): verl" + tail) + "$"):
        _swap.refuse_nonfinite(bad, "values", torch.tensor([[True, False]]), "verl")
    with pytest.raises(ValueError, match="^" + re.escape("values holds NaN or inf (at valid positions): verl" + tail) + "$"):
        _swap.refuse_nonfinite(bad, "values", torch.tensor([[False, True]]), "verl")
    with pytest.raises(ValueError, match=r"^rewards holds NaN or inf \(at valid positions\): OpenRLHF's loop"):
        _swap.refuse_nonfinite(torch.tensor([float("inf")]), "rewards", None, "OpenRLHF")


# ---------------------------------------------------------------------------
# verl: whiten and the argument checks
# ---------------------------------------------------------------------------


def test_verl_whiten_by_hand():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 6.0]], dtype=torch.float64)
    m = torch.tensor([[True, True, True], [True, False, True]])
    vals = torch.tensor([1.0, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
    mu, var = vals.mean(), vals.var(unbiased=True)
    out = verl_adapter.whiten(x, m)
    torch.testing.assert_close(out, (x - mu) / torch.sqrt(var + 1e-8))  # every position, masked ones included
    torch.testing.assert_close(verl_adapter.whiten(x, m, eps=0.5), (x - mu) / torch.sqrt(var + 0.5))
    with pytest.raises(ValueError, match=r"^eps must be non-negative, got -1\.0$"):
        verl_adapter.whiten(x, m, eps=-1.0)
    with pytest.raises(TypeError, match=r"^values must be a torch\.Tensor, got list$"):
        verl_adapter.whiten([1.0], m)


def test_verl_gae_refusals():
    r = torch.zeros(2, 3)
    m = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"^values must have the shape of token_level_rewards \(2, 3\), got \(3,\)$"):
        verl_adapter.compute_gae_advantage_return(r, torch.zeros(3), m, 1.0, 1.0)
    with pytest.raises(TypeError, match=r"^token_level_rewards must be a torch\.Tensor, got list$"):
        verl_adapter.compute_gae_advantage_return([0.0], r, m, 1.0, 1.0)
    with pytest.raises(TypeError, match=r"^values must be a torch\.Tensor, got list$"):
        verl_adapter.compute_gae_advantage_return(r, [0.0], m, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"^response_mask must have shape \(2, 3\), got \(3,\)$"):
        verl_adapter.compute_gae_advantage_return(r, r, torch.ones(3, dtype=torch.bool), 1.0, 1.0)
    with pytest.raises(ValueError, match=r"^gamma must lie in \[0, 1\], got 2\.0$"):
        verl_adapter.compute_gae_advantage_return(r, r, m, 2.0, 1.0)
    with pytest.raises(ValueError, match=r"^lam must lie in \[0, 1\], got 2\.0$"):
        verl_adapter.compute_gae_advantage_return(r, r, m, 1.0, 2.0)
    nan = torch.tensor([[0.0, float("nan"), 0.0], [0.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match=r"^token_level_rewards holds NaN or inf \(at valid positions\): verl's loop"):
        verl_adapter.compute_gae_advantage_return(nan, r, m, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"^values holds NaN or inf \(at valid positions\): verl's loop"):
        verl_adapter.compute_gae_advantage_return(r, nan, m, 1.0, 1.0)
    with pytest.raises(TypeError, match=r"^core_algos must be the module verl\.trainer\.ppo\.core_algos$"):
        verl_adapter.install(types.ModuleType("not_verl"))
    with pytest.raises(TypeError, match=r"^core_algos must be the module verl\.trainer\.ppo\.core_algos$"):
        verl_adapter.is_installed("verl")


def test_verl_install_into_a_stand_in_module():
    core = types.ModuleType("core_algos")
    core.compute_gae_advantage_return = _old
    core.ADV_ESTIMATOR_REGISTRY = {"gae": _old}
    assert not verl_adapter.is_installed(core)
    restore = verl_adapter.install(core)
    assert core.compute_gae_advantage_return is verl_adapter.compute_gae_advantage_return
    assert core.ADV_ESTIMATOR_REGISTRY["gae"] is verl_adapter.compute_gae_advantage_return
    assert verl_adapter.is_installed(core)
    core.ADV_ESTIMATOR_REGISTRY["gae"] = _old  # attribute swapped, registry not: not installed
    assert not verl_adapter.is_installed(core)
    restore()
    assert core.compute_gae_advantage_return is _old and core.ADV_ESTIMATOR_REGISTRY["gae"] is _old
    bare = types.ModuleType("core_algos")  # no registry: the attribute alone decides
    bare.compute_gae_advantage_return = _old
    back = verl_adapter.install(bare)
    assert verl_adapter.is_installed(bare)
    back()
    assert not verl_adapter.is_installed(bare)
    assert verl_adapter.HYDRA_OVERRIDE == ("+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook="
                                           "valuelab.integrations.verl.ray_worker_setup")
    assert verl_adapter.RAY_WORKER_SETUP == "valuelab.integrations.verl.ray_worker_setup"


# ---------------------------------------------------------------------------
# TRL's layout
# ---------------------------------------------------------------------------


def test_from_trl_layouts_by_hand():
    from valuelab.integrations.trl import TRLBatch, from_trl

    r = torch.tensor([[0.1, 0.2, 5.0, 0.0], [0.3, 0.4, 0.5, 7.0]], dtype=torch.float64)
    v = torch.arange(8, dtype=torch.float64).reshape(2, 4)
    n = torch.tensor([1, 3], dtype=torch.int32)  # row 0: last token 1, score at the phantom step 2; row 1: no room
    ph = from_trl(r, v, n)
    assert isinstance(ph, TRLBatch) and ph.rewards is r and ph.values is v
    assert ph.mask.tolist() == [[True, True, True, False], [True, True, True, True]]
    flat = from_trl(r, v, n, phantom=False)
    assert flat.rewards.tolist() == [[0.1, 5.2, 0.0, 0.0], [0.3, 0.4, 0.5, 7.0]]
    assert flat.mask.tolist() == [[True, True, False, False], [True, True, True, True]]
    assert r.tolist()[0] == [0.1, 0.2, 5.0, 0.0]  # the input is not changed


def test_trl_advantages_by_hand():
    from valuelab.integrations.trl import trl_advantages

    r = torch.tensor([[0.1, 0.2, 5.0, 0.0], [0.3, 0.4, 0.5, 7.0]], dtype=torch.float64)
    v = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.5, 1.5, 2.5, 3.5]], dtype=torch.float64)
    n = torch.tensor([1, 3])
    gamma, lam = 0.9, 0.8
    adv = torch.zeros(2, 4, dtype=torch.float64)
    for b, end in enumerate([2, 3]):  # the recursion runs to the phantom step (or the last token when there is no room)
        last = 0.0
        for t in reversed(range(end + 1)):
            nxt = float(v[b, t + 1]) if t < end else 0.0
            last = float(r[b, t]) + gamma * nxt - float(v[b, t]) + gamma * lam * last
            adv[b, t] = last
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    valid = torch.tensor([[True, True, False, False], [True, True, True, True]])
    got_adv, got_ret = trl_advantages(r, v, n, gamma, lam)
    torch.testing.assert_close(got_ret, adv + torch.where(mask, v, torch.zeros((), dtype=torch.float64)))
    vals = adv[valid]
    want = torch.where(valid, (adv - vals.mean()) / torch.sqrt(vals.var() + 1e-8), torch.zeros((), dtype=torch.float64))
    torch.testing.assert_close(got_adv, want)


@pytest.mark.parametrize(
    "args, error, message",
    [
        (([0.0], torch.zeros(2, 3), torch.tensor([0, 0])), TypeError, "rewards must be a torch.Tensor, got list"),
        ((torch.zeros(2, 3), [0.0], torch.tensor([0, 0])), TypeError, "values must be a torch.Tensor, got list"),
        ((torch.zeros(3), torch.zeros(3), torch.tensor([0])), ValueError, "rewards and values must be (B, T) of one shape, got (3,) and (3,)"),
        ((torch.zeros(2, 3), torch.zeros(2, 2), torch.tensor([0, 0])), ValueError,
         "rewards and values must be (B, T) of one shape, got (2, 3) and (2, 2)"),
        ((torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([0.0, 0.0])), TypeError,
         "sequence_lengths must be an integer tensor (the index of each response's last token)"),
        ((torch.zeros(2, 3), torch.zeros(2, 3), [0, 0]), TypeError,
         "sequence_lengths must be an integer tensor (the index of each response's last token)"),
        ((torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([0, 0, 0])), ValueError, "sequence_lengths must have shape (2,), got (3,)"),
        ((torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([0, 3])), ValueError, "sequence_lengths must lie in [0, 2]"),
        ((torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([-1, 0])), ValueError, "sequence_lengths must lie in [0, 2]"),
    ],
)
def test_trl_refusals(args, error, message):
    import re

    from valuelab.integrations.trl import from_trl, trl_advantages

    with pytest.raises(error, match="^" + re.escape(message) + "$"):
        from_trl(*args)
    with pytest.raises(error, match="^" + re.escape(message) + "$"):
        trl_advantages(*args, 1.0, 1.0)
    assert from_trl(torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([0, 2], dtype=torch.int32)).mask.shape == (2, 3)


# ---------------------------------------------------------------------------
# OpenRLHF: the loop written out ("zero" holes), the refusals, the install
# ---------------------------------------------------------------------------


def _openrlhf_loop(values, rewards, mask, gamma, lam):
    """OpenRLHF's get_advantages_and_returns: masked entries are zeros, the recursion runs through them."""
    values, rewards = values * mask, rewards * mask
    B, T = rewards.shape
    adv = torch.zeros(B, T, dtype=torch.float64)
    last = torch.zeros(B, dtype=torch.float64)
    for t in reversed(range(T)):
        nxt = values[:, t + 1] if t < T - 1 else torch.zeros(B, dtype=torch.float64)
        last = rewards[:, t] + gamma * nxt - values[:, t] + gamma * lam * last
        adv[:, t] = last
    return adv, adv + values


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_openrlhf_matches_its_loop(dtype):
    from valuelab.integrations import openrlhf

    g = torch.Generator().manual_seed(0)
    v = torch.randn(3, 6, generator=g, dtype=torch.float64)
    r = torch.randn(3, 6, generator=g, dtype=torch.float64)
    m = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 1, 0, 0], [0, 1, 1, 1, 1, 0]], dtype=torch.bool)
    want_a, want_r = _openrlhf_loop(v, r, m.double(), 0.9, 0.8)
    a, ret = openrlhf.advantages_and_returns(v.to(dtype), r.to(dtype), m, 0.9, 0.8)
    tol = dict(rtol=0, atol=1e-12 if dtype == torch.float64 else 1e-5)
    assert a.dtype == dtype and ret.dtype == dtype
    torch.testing.assert_close(a.double(), want_a, **tol)
    torch.testing.assert_close(ret.double(), want_r, **tol)
    a2, r2 = openrlhf.get_advantages_and_returns(object(), v.to(dtype), r.to(dtype), m, 0.9, 0.8)
    torch.testing.assert_close(a2, a, rtol=0, atol=0)
    torch.testing.assert_close(r2, ret, rtol=0, atol=0)
    no_mask_a, no_mask_r = openrlhf.advantages_and_returns(v, r, None, 1.0, 0.95)
    want_a, want_r = _openrlhf_loop(v, r, torch.ones(3, 6, dtype=torch.float64), 1.0, 0.95)
    torch.testing.assert_close(no_mask_a, want_a)
    torch.testing.assert_close(no_mask_r, want_r)
    vg = v.clone().requires_grad_()
    out = openrlhf.advantages_and_returns(vg, r, m, 0.9, 0.8)
    assert not out[0].requires_grad and not out[1].requires_grad  # no gradient, as in OpenRLHF


def test_openrlhf_refusals_and_install():
    import re

    from valuelab.integrations import openrlhf

    z = torch.zeros(2, 3)
    m = torch.ones(2, 3, dtype=torch.bool)
    cases = [
        (lambda: openrlhf.advantages_and_returns([0.0], z, m, 1.0, 1.0), TypeError, "values must be a torch.Tensor, got list"),
        (lambda: openrlhf.advantages_and_returns(z, [0.0], m, 1.0, 1.0), TypeError, "rewards must be a torch.Tensor, got list"),
        (lambda: openrlhf.advantages_and_returns(z, torch.zeros(3), m, 1.0, 1.0), ValueError,
         "rewards must have the shape of values (2, 3), got (3,)"),
        (lambda: openrlhf.advantages_and_returns(z, z, torch.ones(3, dtype=torch.bool), 1.0, 1.0), ValueError,
         "action_mask must have shape (2, 3), got (3,)"),
        (lambda: openrlhf.advantages_and_returns(z, z, m, 1.5, 1.0), ValueError, "gamma must lie in [0, 1], got 1.5"),
        (lambda: openrlhf.advantages_and_returns(z, z, m, 1.0, 1.5), ValueError, "lambd must lie in [0, 1], got 1.5"),
        (lambda: openrlhf.advantages_and_returns(z, z, m, torch.ones(2), 1.0), ValueError,
         "gamma must be a number or a 0-d tensor; got shape (2,)"),
        (lambda: openrlhf.install(object), TypeError,
         "experience_maker must be the class openrlhf.trainer.ppo_utils.experience_maker.RemoteExperienceMaker"),
        (lambda: openrlhf.is_installed(object()), TypeError,
         "experience_maker must be the class openrlhf.trainer.ppo_utils.experience_maker.RemoteExperienceMaker"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match="^" + re.escape(message) + "$"):
            call()
    nan = torch.tensor([[0.0, float("nan"), 0.0], [0.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match=r"^values holds NaN or inf \(at masked positions only\): OpenRLHF's loop"):
        openrlhf.advantages_and_returns(nan, z, torch.tensor([[1, 0, 1], [1, 1, 1]], dtype=torch.bool), 1.0, 1.0)
    with pytest.raises(ValueError, match=r"^rewards holds NaN or inf \(at valid positions\): OpenRLHF's loop"):
        openrlhf.advantages_and_returns(z, nan, m, 1.0, 1.0)

    class Maker:
        def get_advantages_and_returns(self, *args):
            return "theirs"

    assert not openrlhf.is_installed(Maker)
    restore = openrlhf.install(Maker)
    assert openrlhf.is_installed(Maker) and Maker.get_advantages_and_returns is openrlhf.get_advantages_and_returns
    restore()
    assert not openrlhf.is_installed(Maker) and Maker().get_advantages_and_returns() == "theirs"
    assert openrlhf.RAY_WORKER_SETUP == "valuelab.integrations.openrlhf.ray_worker_setup"


def _verl_loop(r, v, mask, gamma, lam):
    """verl 0.9.1's compute_gae_advantage_return, written out: holes skipped, the running values carried."""
    B, T = r.shape
    gamma = torch.as_tensor(gamma, dtype=torch.float64).reshape(-1)
    lam = torch.as_tensor(lam, dtype=torch.float64).reshape(-1)
    nextvalues = torch.zeros(B, dtype=torch.float64)
    last = torch.zeros(B, dtype=torch.float64)
    out = torch.zeros(B, T, dtype=torch.float64)
    for t in reversed(range(T)):
        m = mask[:, t].double()
        delta = r[:, t] + gamma * nextvalues - v[:, t]
        new = delta + gamma * lam * last
        nextvalues = v[:, t] * m + (1 - m) * nextvalues
        last = new * m + (1 - m) * last
        out[:, t] = last
    returns = out + v
    vals = out[mask]
    return (out - vals.mean()) / torch.sqrt(vals.var() + 1e-8), returns


@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.9, 0.7), (torch.tensor([0.9, 1.0, 0.5]), torch.tensor(0.8))])
def test_verl_matches_its_loop(gamma, lam):
    g = torch.Generator().manual_seed(1)
    r = torch.randn(3, 6, generator=g, dtype=torch.float64)
    v = torch.randn(3, 6, generator=g, dtype=torch.float64)
    m = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 1, 0, 0], [0, 1, 1, 0, 1, 0]], dtype=torch.bool)
    want_a, want_r = _verl_loop(r, v, m, gamma, lam)
    a, ret = verl_adapter.compute_gae_advantage_return(r, v, m, gamma, lam)
    torch.testing.assert_close(a, want_a, rtol=0, atol=1e-12)
    torch.testing.assert_close(ret, want_r, rtol=0, atol=1e-12)
    a32, r32 = verl_adapter.compute_gae_advantage_return(r.float(), v, m, gamma, lam)  # fp32 with fp64: fp64 out
    assert a32.dtype == torch.float64 and r32.dtype == torch.float64
    ah, rh = verl_adapter.compute_gae_advantage_return(r.half(), v.half(), m, gamma, lam)
    assert ah.dtype == torch.float16 and rh.dtype == torch.float16
    vg = v.clone().requires_grad_()
    out = verl_adapter.compute_gae_advantage_return(r, vg, m, gamma, lam)
    assert not out[0].requires_grad and not out[1].requires_grad


# ---------------------------------------------------------------------------
# TorchRL's adapter: every refusal, its whole message
# ---------------------------------------------------------------------------

from valuelab.integrations import torchrl as T  # noqa: E402

GAE = T.generalized_advantage_estimate
_r = torch.zeros(2, 3, 1)
_v = torch.zeros(2, 3, 1)
_d = torch.zeros(2, 3, 1, dtype=torch.bool)
r, v, d = _r, _v, _d

TORCHRL_REFUSALS = [
    (lambda: GAE(0.9, 0.9, v, v, [0.0], d), TypeError,
     'reward must be a torch.Tensor, got list'),
    (lambda: GAE(0.9, 0.9, v, v, torch.zeros(2, 3, 1, dtype=torch.long), d), TypeError,
     'reward must have a floating dtype (float32 or float64), got torch.int64'),
    (lambda: GAE(0.9, 0.9, v, v, torch.full((2, 3, 1), float("nan")), d), ValueError,
     'reward must be finite: it contains NaN or inf (reward[0, 0, 0] = nan)'),
    (lambda: GAE(0.9, 0.9, torch.zeros(2, 3), v, r, d), ValueError,
     'state_value must have the shape of reward, (2, 3, 1), got (2, 3) (TorchRL requires one shape for all the tensors; nothing is broadcast)'),
    (lambda: GAE(0.9, 0.9, v, torch.zeros(2, 3), r, d), ValueError,
     'next_state_value must have the shape of reward, (2, 3, 1), got (2, 3) (TorchRL requires one shape for all the tensors; nothing is broadcast)'),
    (lambda: GAE(0.9, 0.9, v.double(), v, r, d), TypeError,
     'state_value must have the dtype of reward: torch.float64 != torch.float32'),
    (lambda: GAE(0.9, 0.9, v, v.double(), r, d), TypeError,
     'next_state_value must have the dtype of reward: torch.float64 != torch.float32'),
    (lambda: GAE(0.9, 0.9, [0.0], v, r, d), TypeError,
     'state_value must be a torch.Tensor, got list'),
    (lambda: GAE(0.9, 0.9, v, v, r, [True]), TypeError,
     'done must be a bool torch.Tensor, got list'),
    (lambda: GAE(0.9, 0.9, v, v, r, d.long()), TypeError,
     'done must be a bool tensor, got torch.int64: TorchRL takes ~done, which on an integer tensor is a bitwise NOT (~1 == -2, not 0) and on a float tensor fails; pass done.bool()'),
    (lambda: GAE(0.9, 0.9, v, v, r, torch.zeros(2, 3, dtype=torch.bool)), ValueError,
     'done must have the shape of reward, (2, 3, 1), got (2, 3)'),
    (lambda: GAE(0.9, 0.9, v, v, r, d, terminated=d.float()), TypeError,
     'terminated must be a bool tensor, got torch.float32: TorchRL takes ~terminated, which on an integer tensor is a bitwise NOT (~1 == -2, not 0) and on a float tensor fails; pass terminated.bool()'),
    (lambda: GAE(0.9, 0.9, v, v, r, d, terminated=torch.zeros(3, dtype=torch.bool)), ValueError,
     'terminated must have the shape of reward, (2, 3, 1), got (3,)'),
    (lambda: GAE(0.9, 0.9, v, v, r, d, time_dim=3), ValueError,
     'time_dim=3 is not a dimension of reward, of shape (2, 3, 1)'),
    (lambda: GAE(0.9, 0.9, v, v, r, d, time_dim=-4), ValueError,
     'time_dim=-4 is not a dimension of reward, of shape (2, 3, 1)'),
    (lambda: GAE(0.9, 0.9, v, v, r, d, time_dim=1.0), TypeError,
     'time_dim must be an int, got float'),
    (lambda: GAE(True, 0.9, v, v, r, d), TypeError,
     'gamma must be a float or a tensor, not bool'),
    (lambda: GAE(torch.tensor(True), 0.9, v, v, r, d), TypeError,
     'gamma must be a real number or a real tensor, got a torch.bool tensor'),
    (lambda: GAE(torch.zeros(5), 0.9, v, v, r, d), ValueError,
     "gamma of shape (5,) does not broadcast to reward's shape (2, 3, 1)"),
    (lambda: GAE(1.5, 0.9, v, v, r, d), ValueError,
     'gamma must lie in [0, 1]'),
    (lambda: GAE("0.9", 0.9, v, v, r, d), TypeError,
     'gamma must be a real number or a torch.Tensor, got str'),
    (lambda: GAE(0.9, 1.5, v, v, r, d), ValueError,
     'lmbda must lie in [0, 1]'),
    (lambda: GAE(0.9, torch.full((2, 1, 1), 1.5), v, v, r, d), ValueError,
     'lmbda must lie in [0, 1]'),
    (lambda: GAE(0.9, torch.zeros(1, dtype=torch.complex64), v, v, r, d), TypeError,
     'lmbda must be a real number or a real tensor, got a torch.complex64 tensor'),
    (lambda: T.vec_generalized_advantage_estimate(0.9, 0.9, torch.zeros(2, 3), v, r, d), ValueError,
     'state_value must have the shape of reward, (2, 3, 1), got (2, 3) (TorchRL requires one shape for all the tensors; nothing is broadcast)'),
    (lambda: T.to_torchrl([0.0], torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)), TypeError,
     'rewards must be a torch.Tensor, got list'),
    (lambda: T.to_torchrl(torch.zeros(2, 3), [0.0], torch.ones(2, 3, dtype=torch.bool)), TypeError,
     'values must be a torch.Tensor, got list'),
    (lambda: T.to_torchrl(torch.zeros(2, 3), torch.zeros(2, 2), torch.ones(2, 3, dtype=torch.bool)), ValueError,
     'rewards and values must be (B, T) of one shape, got (2, 3) and (2, 2)'),
    (lambda: T.to_torchrl(torch.zeros(3), torch.zeros(3), torch.ones(3, dtype=torch.bool)), ValueError,
     'rewards and values must be (B, T) of one shape, got (3,) and (3,)'),
    (lambda: T.to_torchrl(torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([[1, 1, 0], [0, 0, 0]], dtype=torch.bool)), ValueError,
     'mask: every row needs at least one valid token'),
    (lambda: T.to_torchrl(torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([[1, 0, 1], [1, 0, 0]], dtype=torch.bool)), ValueError,
     'mask must be right-padded (no holes): TorchRL has no notion of a hole inside a trajectory'),
    (lambda: T.to_torchrl(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool), truncated=torch.ones(2)), TypeError,
     'truncated must be a bool tensor, one flag per row'),
    (lambda: T.to_torchrl(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool), truncated=torch.ones(3, dtype=torch.bool)), ValueError,
     'truncated must have shape (2,), one flag per row, got (3,)'),
    (lambda: T.to_torchrl(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool), truncated=torch.tensor([True, False])), ValueError,
     'truncated rows need bootstrap, the value of the state after their last token'),
    (lambda: T.to_torchrl(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool), truncated=torch.tensor([True, False]), bootstrap=torch.zeros(3)), ValueError,
     'bootstrap must have shape (2,), got (3,)'),
    (lambda: T.to_torchrl(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool), truncated=torch.tensor([True, False]), bootstrap=[0.0, 0.0]), TypeError,
     'bootstrap must be a torch.Tensor, got list'),
    (lambda: T.from_torchrl(v.long(), v, r, d), TypeError,
     'state_value must be a float tensor, got torch.int64'),
    (lambda: T.from_torchrl(v, [0.0], r, d), TypeError,
     'next_state_value must be a float tensor, got list'),
    (lambda: T.from_torchrl(v, v, torch.zeros(2, 3), d), ValueError,
     'reward must have shape (B, T, 1), got (2, 3)'),
    (lambda: T.from_torchrl(torch.zeros(2, 2, 1), v, r, d), ValueError,
     'state_value must have the shape of reward, (2, 3, 1), got (2, 2, 1)'),
    (lambda: T.from_torchrl(v, torch.zeros(2, 2, 1), r, d), ValueError,
     'next_state_value must have the shape of reward, (2, 3, 1), got (2, 2, 1)'),
    (lambda: T.from_torchrl(v, v, r, d), ValueError,
     "done: row 0 has no done step, so it does not say where its trajectory ends (TorchRL would end it at the row's last step and bootstrap there); from_torchrl reads one trajectory per row, ended by its first done. Mark the end, or use valuelab.integrations.torchrl.generalized_advantage_estimate computes GAE on rows holding several trajectories (TorchRL's layout) directly"),
    (lambda: T.from_torchrl(v, v, r, torch.tensor([[[True], [False], [True]], [[True], [False], [False]]])), ValueError,
     "done: row 0 has 2 done steps (t = 0, 2): the steps after its first done are another trajectory, not padding (padding has no done). from_torchrl reads one trajectory per row; valuelab.integrations.torchrl.generalized_advantage_estimate computes GAE on rows holding several trajectories (TorchRL's layout) directly"),
    (lambda: T.from_torchrl(torch.zeros(1, 8, 1), torch.zeros(1, 8, 1), torch.zeros(1, 8, 1), torch.ones(1, 8, 1, dtype=torch.bool)), ValueError,
     "done: row 0 has 8 done steps (t = 0, 1, 2, 3, 4, ...): the steps after its first done are another trajectory, not padding (padding has no done). from_torchrl reads one trajectory per row; valuelab.integrations.torchrl.generalized_advantage_estimate computes GAE on rows holding several trajectories (TorchRL's layout) directly"),
    (lambda: T.from_torchrl(v, v, r, torch.tensor([[[False], [True], [False]], [[True], [False], [False]]]), terminated=torch.tensor([[[True], [False], [False]], [[True], [False], [False]]])), ValueError,
     "terminated: row 0 is terminated at t = 0, which is not its done step: inside a trajectory (no bootstrap there, the recursion carried on) or in its padding, valuelab's one-trajectory batch cannot say that; valuelab.integrations.torchrl.generalized_advantage_estimate computes GAE on rows holding several trajectories (TorchRL's layout) directly"),
]


@pytest.mark.parametrize("call, error, message", TORCHRL_REFUSALS, ids=[str(i) for i in range(len(TORCHRL_REFUSALS))])
def test_torchrl_refusals(call, error, message):
    import re

    with pytest.raises(error, match="^" + re.escape(message) + "$"):
        call()


# ---------------------------------------------------------------------------
# more of _swap, verl's registry, TorchRL's layouts
# ---------------------------------------------------------------------------


def test_installed_and_swap_with_inherited_and_static_attributes():
    class Base:
        def method(self):
            return "base"

        @staticmethod
        def helper():
            return "helper"

    class Maker(Base):
        pass

    assert _swap.installed(Maker, "method", Base.method)  # inherited: read through getattr
    assert not _swap.installed(Maker, "method", _new)
    static = staticmethod(_new)
    Maker.tool = static
    assert _swap.installed(Maker, "tool", static)  # the class's own entry, the descriptor itself
    back = _swap.swap(Base, "helper", _new)
    assert Base.helper is _new
    back()
    assert Base().helper() == "helper"  # the staticmethod itself was kept and put back, not its function


def test_verl_install_leaves_a_registry_that_is_not_a_dict_alone():
    core = types.ModuleType("core_algos")
    core.compute_gae_advantage_return = _old
    core.ADV_ESTIMATOR_REGISTRY = ("not", "a", "dict")
    restore = verl_adapter.install(core)
    assert core.compute_gae_advantage_return is verl_adapter.compute_gae_advantage_return
    assert core.ADV_ESTIMATOR_REGISTRY == ("not", "a", "dict") and verl_adapter.is_installed(core)
    restore()
    assert core.compute_gae_advantage_return is _old


def test_to_and_from_torchrl_by_hand():
    r = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 0.0]])
    v = torch.tensor([[0.5, 0.6, 0.7], [0.8, 0.9, 0.0]])
    m = torch.tensor([[True, True, True], [True, True, False]])
    kw = T.to_torchrl(r, v, m)  # no truncation: every row terminates at its last token
    assert kw["state_value"].shape == (2, 3, 1) and kw["reward"][..., 0].tolist() == r.tolist()
    torch.testing.assert_close(kw["next_state_value"][..., 0], torch.tensor([[0.6, 0.7, 0.0], [0.9, 0.0, 0.0]]))
    assert kw["done"][..., 0].tolist() == [[False, False, True], [False, True, False]]
    assert kw["terminated"][..., 0].tolist() == kw["done"][..., 0].tolist()
    cut = T.to_torchrl(r, v, m, truncated=torch.tensor([False, True]), bootstrap=torch.tensor([9.0, 7.0], dtype=torch.float64))
    assert cut["next_state_value"].dtype == torch.float32  # the bootstrap takes the values' dtype
    torch.testing.assert_close(cut["next_state_value"][..., 0], torch.tensor([[0.6, 0.7, 0.0], [0.9, 7.0, 0.0]]))
    assert cut["terminated"][..., 0].tolist() == [[False, False, True], [False, False, False]]
    back = T.from_torchrl(cut["state_value"], cut["next_state_value"], cut["reward"], cut["done"], cut["terminated"])
    assert back.rewards.tolist() == r.tolist()
    torch.testing.assert_close(back.values, v)
    assert back.mask.tolist() == m.tolist() and back.bootstrap.tolist() == pytest.approx([0.0, 7.0])
    plain = T.from_torchrl(kw["state_value"], kw["next_state_value"], kw["reward"], kw["done"])
    assert plain.bootstrap.tolist() == [0.0, 0.0]
    torch.testing.assert_close(plain.values, v)


def test_from_torchrl_refuses_a_last_axis_other_than_one_and_lists_done_steps():
    import re

    x = torch.zeros(2, 3, 2)
    with pytest.raises(ValueError, match=r"^state_value must have shape \(B, T, 1\), got \(2, 3, 2\)$"):
        T.from_torchrl(x, x, x, torch.zeros(2, 3, 2, dtype=torch.bool))
    for n, listed in ((5, "t = 0, 1, 2, 3, 4)"), (6, "t = 0, 1, 2, 3, 4, ...)")):
        z = torch.zeros(1, n, 1)
        with pytest.raises(ValueError, match="^" + re.escape(f"done: row 0 has {n} done steps ({listed}: the steps")):
            T.from_torchrl(z, z, z, torch.ones(1, n, 1, dtype=torch.bool))


def test_openrlhf_takes_scalar_discounts_only():
    from valuelab.integrations import openrlhf

    z = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"^lambd must be a number or a 0-d tensor; got shape \(2,\)$"):
        openrlhf.advantages_and_returns(z, z, None, 1.0, torch.full((2,), 0.9))


def test_torchrl_discounts_stay_exact_and_dense_reward():
    r = torch.zeros(2, 3, 1)
    assert T._discount(0.1, "gamma", r) == 0.1 and isinstance(T._discount(0.1, "gamma", r), float)  # not rounded to float32
    assert T._discount(1, "lmbda", r) == 1.0
    with pytest.raises(TypeError, match=r"^reward must be a dense \(strided\) tensor, got layout torch\.sparse_coo$"):
        T.generalized_advantage_estimate(0.9, 0.9, r, r, r.to_sparse(), torch.zeros(2, 3, 1, dtype=torch.bool))


def test_torchrl_empty_and_single_step_batches():
    e = torch.zeros(2, 0, 1)
    adv, target = T.generalized_advantage_estimate(0.9, 0.9, e, e, e, torch.zeros(2, 0, 1, dtype=torch.bool))
    assert adv.shape == (2, 0, 1) and target.shape == (2, 0, 1)
    one = torch.tensor([[[2.0]]])
    adv, target = T.generalized_advantage_estimate(0.9, 0.5, one * 0.5, one * 3.0, one, torch.tensor([[[False]]]))
    assert adv.item() == pytest.approx(2.0 + 0.9 * 6.0 - 1.0) and target.item() == pytest.approx(2.0 + 0.9 * 6.0)  # + V - V


def test_torchrl_flags_are_dense_and_outputs_contiguous():
    r = torch.zeros(2, 3, 1)
    with pytest.raises(TypeError, match=r"^done must be a dense \(strided\) tensor, got layout torch\.sparse_coo$"):
        T.generalized_advantage_estimate(0.9, 0.9, r, r, r, torch.zeros(2, 3, 1, dtype=torch.bool).to_sparse())
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 1, generator=g)
    done = torch.zeros(4, 3, 1, dtype=torch.bool)
    done[-1] = True
    adv, target = T.generalized_advantage_estimate(0.9, 0.8, x, x, x, done, time_dim=0)  # time on the first axis
    assert adv.is_contiguous() and target.is_contiguous()
