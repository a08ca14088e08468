"""valuelab.integrations against the trainers' own functions (from their PyPI packages, see tests/peers.py)."""

from __future__ import annotations

import os
import types

import pytest
import torch

import valuelab as vl
from valuelab.integrations import HOLE_CONVENTIONS, carry_into_holes, hole_convention, openrlhf, verl, zero_holes
from valuelab.integrations import torchrl as torchrl_layout
from valuelab.integrations import trl as trl_layout

from peers import openrlhf_gae, trl_ppo_block, verl_compute_advantage, verl_gae


def batch(seed, bs=16, length=24, holes=True, dtype=torch.float32):
    """Random rewards and values, right padding after a random length, and optional holes inside responses."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(bs, length, generator=g, dtype=dtype)
    values = torch.randn(bs, length, generator=g, dtype=dtype)
    lengths = torch.randint(2, length + 1, (bs,), generator=g)
    mask = torch.arange(length)[None] < lengths[:, None]
    if holes:
        hole = torch.rand(bs, length, generator=g) < 0.25
        hole[:, 0] = False
        mask = mask & ~hole
    return rewards, values, mask.to(torch.int64)


CASES = [(seed, holes, gamma, lam) for seed in range(6) for holes in (False, True)
         for gamma, lam in ((1.0, 0.95), (0.99, 0.9), (1.0, 1.0), (0.9, 0.0))]


@pytest.mark.parametrize("seed, holes, gamma, lam", CASES)
def test_verl_matches_verl(seed, holes, gamma, lam):
    theirs = verl_gae()
    rewards, values, mask = batch(seed, holes=holes)
    adv_v, ret_v = theirs(rewards, values, mask, gamma, lam)
    adv, ret = verl.compute_gae_advantage_return(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(ret, ret_v, rtol=1e-5, atol=1e-5)  # every position, padding and holes included
    torch.testing.assert_close(adv, adv_v, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("seed, holes, gamma, lam", CASES)
def test_openrlhf_matches_openrlhf(seed, holes, gamma, lam):
    theirs = openrlhf_gae()
    rewards, values, mask = batch(seed, holes=holes)
    adv_o, ret_o = theirs(values, rewards, mask, gamma, lam)
    adv, ret = openrlhf.advantages_and_returns(values, rewards, mask, gamma, lam)
    torch.testing.assert_close(adv, adv_o, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret, ret_o, rtol=1e-5, atol=1e-5)
    adv_o, _ = theirs(values, rewards, None, gamma, lam)  # no mask: every position is a token
    torch.testing.assert_close(openrlhf.advantages_and_returns(values, rewards, None, gamma, lam)[0], adv_o,
                               rtol=1e-5, atol=1e-5)


def test_openrlhf_outputs_carry_no_gradient_as_in_openrlhf():
    rewards, values, mask = batch(1)
    values.requires_grad_(True)
    adv, ret = openrlhf.advantages_and_returns(values, rewards, mask, 1.0, 0.95)
    assert not adv.requires_grad and not ret.requires_grad


def test_the_two_conventions_agree_without_holes_and_differ_with_them():
    rewards, values, mask = batch(3, holes=False)
    a_verl = carry_into_holes(vl.gae(rewards, values, mask=mask.bool(), lam=0.95).advantages, mask)
    a_orlhf, _ = openrlhf.advantages_and_returns(values, rewards, mask, 1.0, 0.95)
    m = mask.bool()
    torch.testing.assert_close(a_verl[m], a_orlhf[m], rtol=1e-5, atol=1e-5)
    rewards, values, mask = batch(3, holes=True)
    m = mask.bool()
    a_skip = vl.gae(rewards, values, mask=m, lam=0.95).advantages
    a_zero, _ = openrlhf.advantages_and_returns(values, rewards, mask, 1.0, 0.95)
    assert (a_skip[m] - a_zero[m]).abs().max() > 1e-2  # a token before a hole: bootstrapped from V = 0 under "zero"
    # "zero" is valuelab.gae on zeroed inputs with no mask, "skip" is valuelab.gae with the mask
    full = vl.gae(zero_holes(rewards, mask), zero_holes(values, mask), lam=0.95).advantages
    torch.testing.assert_close(a_zero, full)
    assert set(HOLE_CONVENTIONS) == {"skip", "zero"} and "OpenRLHF" in hole_convention("zero")


def test_carry_into_holes_takes_the_next_valid_entry():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]])
    mask = torch.tensor([[1, 0, 0, 1, 0]])
    assert carry_into_holes(x, mask).tolist() == [[1.0, 4.0, 4.0, 4.0, 0.0]]


def test_install_swaps_the_function_verls_trainer_calls():
    """verl's own compute_advantage, run with a core_algos whose GAE valuelab replaced."""
    core_algos = types.ModuleType("core_algos")
    core_algos.compute_gae_advantage_return = verl_gae()
    compute_advantage = verl_compute_advantage(core_algos)
    rewards, values, mask = batch(5, holes=True)
    config = {"use_pf_ppo": False}

    def run():
        data = types.SimpleNamespace(batch={"token_level_rewards": rewards, "values": values, "response_mask": mask})
        return compute_advantage(data, "gae", gamma=1.0, lam=0.95, config=config).batch

    ref = run()
    restore = verl.install(core_algos)
    assert core_algos.compute_gae_advantage_return is verl.compute_gae_advantage_return
    ours = run()
    restore()
    assert core_algos.compute_gae_advantage_return is not verl.compute_gae_advantage_return
    torch.testing.assert_close(ours["advantages"], ref["advantages"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ours["returns"], ref["returns"], rtol=1e-5, atol=1e-5)


def test_masked_var_matches_its_definition():
    x = torch.tensor([[1.0, 2.0, 4.0, 100.0]])
    m = torch.tensor([[1, 1, 1, 0]])
    assert abs(float(vl.losses.masked_var(x, m)) - 7 / 3) < 1e-6
    assert abs(float(vl.losses.masked_var(x, m, unbiased=False)) - 14 / 9) < 1e-6
    with pytest.raises(ValueError):
        vl.losses.masked_var(x, torch.tensor([[1, 0, 0, 0]]))
    with pytest.raises(TypeError):
        vl.losses.masked_var(x, m, unbiased=1)


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda: verl.compute_gae_advantage_return(torch.ones(2, 3), torch.ones(2, 4), torch.ones(2, 3), 1.0, 0.9), ValueError),
        (lambda: verl.compute_gae_advantage_return(torch.ones(2, 3), torch.ones(2, 3), torch.ones(2, 4), 1.0, 0.9), ValueError),
        (lambda: verl.compute_gae_advantage_return(torch.ones(2, 3), torch.ones(2, 3), torch.ones(2, 3), 1.0, 1.5), ValueError),
        (lambda: openrlhf.advantages_and_returns(torch.ones(2, 3), torch.ones(2, 4), None, 1.0, 0.9), ValueError),
        (lambda: verl.install(object()), TypeError),
        (lambda: hole_convention("drop"), ValueError),
    ],
)
def test_bad_arguments_raise(call, error):
    with pytest.raises(error):
        call()


def _torchrl_gae():
    try:
        from torchrl.objectives.value.functional import vec_generalized_advantage_estimate
    except Exception:  # noqa: BLE001 - torchrl missing or built for another torch
        if os.environ.get("REQUIRE_PEERS"):
            raise
        pytest.skip("torchrl is not importable")
    return vec_generalized_advantage_estimate


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.99, 0.9), (0.9, 0.5)])  # TorchRL 0.14.1's vectorised GAE fails at lam = 0
def test_torchrl_layout_gives_torchrls_gae_equal_to_valuelabs(seed, gamma, lam):
    vec_gae = _torchrl_gae()
    rewards, values, mask = batch(seed, holes=False, dtype=torch.float64)
    m = mask.bool()
    g = torch.Generator().manual_seed(100 + seed)
    truncated = torch.rand(m.shape[0], generator=g) < 0.5
    boot = torch.randn(m.shape[0], generator=g, dtype=torch.float64)
    kw = torchrl_layout.to_torchrl(rewards, values, m, truncated=truncated, bootstrap=boot)
    adv_t, ret_t = vec_gae(gamma, lam, **kw, time_dim=-2)
    ours = vl.gae(rewards, values, mask=m, gamma=gamma, lam=lam, bootstrap=torch.where(truncated, boot, torch.zeros_like(boot)))
    torch.testing.assert_close(adv_t.squeeze(-1)[m], ours.advantages[m], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ret_t.squeeze(-1)[m], ours.returns[m], rtol=1e-6, atol=1e-6)
    back = torchrl_layout.from_torchrl(**kw)  # and back to valuelab's layout
    assert torch.equal(back.mask, m)
    torch.testing.assert_close(back.bootstrap, torch.where(truncated, boot, torch.zeros_like(boot)))
    torch.testing.assert_close(back.rewards, torch.where(m, rewards, torch.zeros_like(rewards)))


def test_torchrl_layout_refuses_holes_and_truncation_without_bootstrap():
    rewards, values, mask = batch(0, holes=True)
    with pytest.raises(ValueError, match="holes"):
        torchrl_layout.to_torchrl(rewards, values, mask.bool())
    rewards, values, mask = batch(0, holes=False)
    with pytest.raises(ValueError, match="bootstrap"):
        torchrl_layout.to_torchrl(rewards, values, mask.bool(), truncated=torch.ones(mask.shape[0], dtype=torch.bool))


def trl_tensors(seed, bs=12, length=16):
    """What TRL's train() holds before its reward step: log-probs, values, scores and each response's last index."""
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, length, (bs,), generator=g)
    seq[0] = length - 1  # a response that fills its row: no room for the phantom step
    return dict(
        responses=torch.zeros(bs, length, dtype=torch.long),
        sequence_lengths=seq,
        logprobs=-torch.rand(bs, length, generator=g) * 3,
        ref_logprobs=-torch.rand(bs, length, generator=g) * 3,
        values=torch.randn(bs, length, generator=g),
        scores=torch.randn(bs, generator=g),
    )


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (1.0, 1.0), (0.9, 0.8)])
def test_trl_advantages_match_trls_ppo_trainer(seed, gamma, lam):
    run = trl_ppo_block()
    args = types.SimpleNamespace(kl_estimator="k1", kl_coef=0.05, whiten_rewards=False, gamma=gamma, lam=lam)
    ns = run(args=args, **trl_tensors(seed))
    adv, ret = trl_layout.trl_advantages(ns["rewards"], ns["values"], ns["sequence_lengths"], gamma, lam)
    torch.testing.assert_close(adv, ns["advantages"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ret, ns["returns"], rtol=1e-5, atol=1e-5)


def test_trl_phantom_step_and_its_fix():
    """Without the phantom step the score sits on EOS; with gamma = lam = 1 the phantom's value cancels, else it does not."""
    run = trl_ppo_block()
    tensors = trl_tensors(7)
    args = types.SimpleNamespace(kl_estimator="k1", kl_coef=0.05, whiten_rewards=False, gamma=1.0, lam=1.0)
    ns = run(args=args, **tensors)
    n = ns["sequence_lengths"]
    fixed = trl_layout.from_trl(ns["rewards"], ns["values"], n, phantom=False)
    kept = trl_layout.from_trl(ns["rewards"], ns["values"], n, phantom=True)
    rows = torch.arange(n.numel())
    torch.testing.assert_close(fixed.rewards.sum(-1), ns["rewards"].sum(-1))  # the score moved, not lost
    assert torch.equal(fixed.mask.sum(-1), n + 1) and bool((kept.mask.sum(-1) >= n + 1).all())
    valid = fixed.mask
    a_fixed = vl.gae(fixed.rewards, fixed.values, mask=fixed.mask, gamma=1.0, lam=1.0).advantages
    a_kept = vl.gae(kept.rewards, kept.values, mask=kept.mask, gamma=1.0, lam=1.0).advantages
    torch.testing.assert_close(a_fixed[valid], a_kept[valid], rtol=1e-5, atol=1e-5)
    a_fixed = vl.gae(fixed.rewards, fixed.values, mask=fixed.mask, gamma=1.0, lam=0.9).advantages
    a_kept = vl.gae(kept.rewards, kept.values, mask=kept.mask, gamma=1.0, lam=0.9).advantages
    has_phantom = n + 1 < n.new_tensor(valid.shape[1])
    gap = (a_fixed - a_kept)[rows[has_phantom], n[has_phantom]]
    assert gap.abs().max() > 1e-3  # lam < 1: the phantom's value leaks into the EOS token's advantage
    with pytest.raises(ValueError):
        trl_layout.from_trl(ns["rewards"], ns["values"], n + 100)


# --- the inputs the peers accept: mixed dtypes, per-row gamma, scalars, NaN at masked positions ----------


@pytest.mark.parametrize("vdtype, rdtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.float32),
                                            (torch.float32, torch.float64), (torch.bfloat16, torch.bfloat16)])
def test_mixed_dtypes_promote_as_the_peers_do(vdtype, rdtype):
    """Output dtype = the promoted one, as the peers' arithmetic gives. Values: exact where the peers' steps are
    exact in the half dtype (gamma = 1, mixed inputs: the loop then adds in float32); with gamma < 1 verl and
    OpenRLHF round gamma * V to the half dtype at every step, and valuelab does not, so they agree to that
    rounding (bf16: 2**-8 relative per step), not more."""
    rewards, values, mask = batch(7)
    rewards, values = rewards.to(rdtype), values.to(vdtype)
    both_half = rdtype in (torch.bfloat16, torch.float16)
    for gamma in (1.0, 0.99):
        exact = gamma == 1.0 and not both_half
        tol = dict(rtol=1e-4, atol=1e-4) if exact or vdtype == torch.float32 else dict(rtol=0.05, atol=0.05)
        adv_v, ret_v = verl_gae()(rewards, values, mask, gamma, 0.95)
        adv, ret = verl.compute_gae_advantage_return(rewards, values, mask, gamma, 0.95)
        assert adv.dtype == adv_v.dtype and ret.dtype == ret_v.dtype == torch.promote_types(vdtype, rdtype)
        if both_half:  # both round in the half dtype: valuelab's error against float64 is no larger than verl's
            ref = verl_gae()(rewards.double(), values.double(), mask, gamma, 0.95)[1]
            assert float((ret.double() - ref).abs().max()) <= float((ret_v.double() - ref).abs().max()) + 1e-2
        else:
            torch.testing.assert_close(ret.double(), ret_v.double(), **tol)
        adv_o, ret_o = openrlhf_gae()(values, rewards, mask, gamma, 0.95)
        adv, ret = openrlhf.advantages_and_returns(values, rewards, mask, gamma, 0.95)
        assert adv.dtype == adv_o.dtype and ret.dtype == ret_o.dtype
        if not both_half:
            torch.testing.assert_close(ret.double(), ret_o.double(), **tol)


def test_verl_per_row_tensor_gamma_and_lam():
    rewards, values, mask = batch(8)
    gamma = torch.linspace(0.8, 1.0, rewards.shape[0])
    lam = torch.linspace(0.5, 1.0, rewards.shape[0])
    adv_v, ret_v = verl_gae()(rewards, values, mask, gamma, lam)  # verl's loop broadcasts (bs,) per row
    adv, ret = verl.compute_gae_advantage_return(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(ret, ret_v, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(adv, adv_v, rtol=1e-4, atol=1e-4)
    # the nearest wrong reading, one gamma for every row, is far off
    adv_one, _ = verl.compute_gae_advantage_return(rewards, values, mask, float(gamma.mean()), lam)
    assert float((adv_one - adv_v).abs().max()) > 0.05
    adv0, _ = verl.compute_gae_advantage_return(rewards, values, mask, torch.tensor(0.9), torch.tensor(0.95))
    torch.testing.assert_close(adv0, verl_gae()(rewards, values, mask, 0.9, 0.95)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bad, error", [(True, TypeError), ("0.9", TypeError), (torch.tensor(True), TypeError),
                                        (1.5, ValueError), (float("nan"), ValueError), (torch.ones(3), ValueError),
                                        (torch.tensor([1], dtype=torch.long), TypeError)])
@pytest.mark.parametrize("which", ["gamma", "lam"])
def test_scalars_refused_as_vl_gae_refuses_them(bad, error, which):
    rewards, values, mask = batch(9)
    kw = {"gamma": 1.0, "lam": 0.95, which: bad}
    with pytest.raises(error, match=which):
        verl.compute_gae_advantage_return(rewards, values, mask, kw["gamma"], kw["lam"])
    kw = {"gamma": 1.0, "lambd": 0.95, ("lambd" if which == "lam" else which): bad}
    with pytest.raises(error, match="lambd" if which == "lam" else which):
        openrlhf.advantages_and_returns(values, rewards, mask, kw["gamma"], kw["lambd"])


def test_nan_at_a_masked_position_is_refused_and_the_peers_would_spread_it():
    rewards, values, mask = batch(10, holes=False)
    row = int((mask.sum(-1) < mask.shape[1]).nonzero()[0])
    values[row, -1] = float("nan")  # a padding position
    adv_v, _ = verl_gae()(rewards, values, mask, 1.0, 0.95)
    assert bool(torch.isnan(adv_v).all())  # verl: NaN * 0 is NaN, and the whitening spreads it to the batch
    adv_o, _ = openrlhf_gae()(values, rewards, mask, 1.0, 0.95)
    assert bool(torch.isnan(adv_o[row, mask[row].bool()]).all())
    with pytest.raises(ValueError, match=r"values holds NaN or inf \(at masked positions only\).*NaN \* 0"):
        verl.compute_gae_advantage_return(rewards, values, mask, 1.0, 0.95)
    with pytest.raises(ValueError, match=r"values holds NaN or inf \(at masked positions only\)"):
        openrlhf.advantages_and_returns(values, rewards, mask, 1.0, 0.95)


def test_openrlhf_method_binds_with_self():
    rewards, values, mask = batch(11)
    cls = type("Maker", (), {"get_advantages_and_returns": openrlhf.get_advantages_and_returns})
    adv, ret = cls().get_advantages_and_returns(values, rewards, mask, 1.0, 0.95)
    adv_o, ret_o = openrlhf_gae()(values, rewards, mask, 1.0, 0.95)
    torch.testing.assert_close(adv, adv_o, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ret, ret_o, rtol=1e-5, atol=1e-5)
