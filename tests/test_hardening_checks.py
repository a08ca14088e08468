"""Issue 25: the shared checks of ``valuelab._engine.checks`` -- index ranges, flags, scalars, seeds -- and the inputs that got past the old ones.

One section per class of defect. Each test names the input that used to
fail and what it did on the code before the fix (a segfault, a truncated or
broadcast argument read silently, an allocation of terabytes, numpy's or
torch's message instead of one naming the argument). The public functions
are imported at module level; the new check functions inside the tests that
exercise them, so that on the old code every test fails for its own reason.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import valuelab as vl
from valuelab import distributed
from valuelab.lab import critic, policy, ppo, transformer, world
from valuelab.integrations import peers, torchrl as vtorchrl, trl as vtrl
from valuelab.packed import discounted_returns_packed, gae_packed, packing

INT64_MAX = 2**63 - 1


def _run_isolated(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter: a crash there (a segfault) is a failed test here, not a dead test run."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------------
# index arithmetic that overflows
# ---------------------------------------------------------------------------

# lengths cu[1:] - cu[:-1] = [2**63 - 1, -2**63 - 1, 6] wrap around to [2**63 - 1, 2**63 - 1, 6]: all
# "non-negative", and cu starts at 0 and ends at 4. The old packing handed them to repeat_interleave: SIGSEGV.
WRAPPING_CU = [0, INT64_MAX, -2, 4]


def test_offsets_whose_differences_wrap_around_in_int64_are_refused_not_a_segfault():
    """packing(cu_seqlens=[0, 2**63 - 1, -2, 4], 4) segfaulted the process (exit -11); now a ValueError naming cu_seqlens."""
    done = _run_isolated(f"""
        import torch
        from valuelab.packed import gae_packed, discounted_returns_packed
        cu = torch.tensor({WRAPPING_CU})
        for call in (lambda: gae_packed(torch.zeros(4), torch.zeros(4), cu), lambda: discounted_returns_packed(torch.zeros(4), cu)):
            try:
                call()
            except ValueError as err:
                assert str(err).startswith("cu_seqlens must start at 0, never decrease"), str(err)
                assert str(err).endswith("got [0, 9223372036854775807, -2, 4]"), str(err)
            else:
                raise SystemExit("accepted")
        print("refused")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "refused", (done.returncode, done.stdout, done.stderr[-2000:])


def test_offsets_out_of_range_are_refused():
    """Offsets outside [0, n_tokens] are refused whatever their differences (the wrapping ones above: in a subprocess)."""
    for bad in ([0, 2**62, 2**62 + 1, 4], [0, -(2**63), 4], [0, 5, 4]):  # out of [0, n_tokens] though ending right
        with pytest.raises(ValueError, match=r"^cu_seqlens must start at 0"):
            packing(torch.tensor(bad), 4)
    assert packing(torch.tensor([0, 2, 2, 4], dtype=torch.int32), 4).rows.tolist() == [0, 0, 2, 2]


@pytest.mark.parametrize("call, name", [
    (lambda: packing(torch.tensor([0, 2, 4], device="meta"), 4), "cu_seqlens"),
    (lambda: gae_packed(torch.zeros(4), torch.zeros(4), torch.tensor([0, 2, 4]),
                        truncated=torch.ones(2, dtype=torch.bool, device="meta"), bootstrap=torch.zeros(2)), "truncated"),
    (lambda: vtrl.from_trl(torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([0, 1], device="meta")), "sequence_lengths"),
    (lambda: ppo.group_advantages(torch.arange(4.0), torch.tensor([0, 0, 1, 1], device="meta")), "group"),
    (lambda: vtorchrl.from_torchrl(torch.zeros(1, 2, 1, device="meta"), torch.zeros(1, 2, 1), torch.zeros(1, 2, 1),
                                   torch.tensor([[[False], [True]]])), "state_value"),
    (lambda: vtorchrl.to_torchrl(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool),
                                 truncated=torch.ones(1, dtype=torch.bool, device="meta"), bootstrap=torch.zeros(1)), "truncated"),
], ids=["packing", "gae_packed-truncated", "from_trl", "group_advantages", "from_torchrl", "to_torchrl-truncated"])
def test_meta_index_and_flag_tensors_are_refused_before_item(call, name):
    """Meta index tensors reached ``.item()`` (RuntimeError "Tensor.item() cannot be called on meta tensors", or
    NotImplementedError / a device error); now a ValueError naming the argument."""
    with pytest.raises(ValueError, match=rf"^{name} is a meta tensor: it has no data to compute with$"):
        call()


def test_transformer_index_tensors_on_the_meta_device_are_refused_by_name():
    m = transformer.TinyTransformer(1, 6, 4, d_model=4, n_heads=1, d_ff=4, n_layers=1, seed=0)
    with pytest.raises(ValueError, match=r"^inputs is a meta tensor"):
        m(torch.zeros(1, 2, 3, dtype=torch.long, device="meta"))
    inputs = torch.zeros(1, 2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"^lengths is a meta tensor"):
        transformer.final_scores(m, inputs, torch.ones(2, dtype=torch.long, device="meta"))


def test_check_index_range_compares_without_overflow():
    from valuelab._engine.checks import check_index_range

    # PyTorch itself gets these comparisons wrong: the bound wraps into the tensor's dtype
    assert not bool((torch.tensor([1], dtype=torch.int32) < 2**40).any())
    assert not bool((torch.tensor([1]) < 2**63).any())
    # the check clamps the bounds first
    assert check_index_range(torch.tensor([1], dtype=torch.int32), "x", 0, 2**40).dtype == torch.int64
    assert check_index_range(torch.tensor([0, INT64_MAX]), "x", 0, 2**63).tolist() == [0, INT64_MAX]
    assert check_index_range(torch.tensor([-(2**63)]), "x", -(2**70)).tolist() == [-(2**63)]
    with pytest.raises(ValueError, match=r"^x must lie in \[2\*\*63, 2\*\*64\]$"):
        check_index_range(torch.tensor([INT64_MAX]), "x", 2**63, 2**64, message="x must lie in [2**63, 2**64]")
    with pytest.raises(ValueError, match=r"^x must lie in \[0, 3\]$"):
        check_index_range(torch.tensor([0, 4]), "x", 0, 3)
    with pytest.raises(ValueError, match=r"^x must be at least 0$"):
        check_index_range(torch.tensor([-1]), "x", 0)
    with pytest.raises(ValueError, match=r"^x never decreases$"):
        check_index_range(torch.tensor([0, INT64_MAX, -2, 4]), "x", -(2**63), nondecreasing=True, message=lambda: "x never decreases")
    with pytest.raises(TypeError, match=r"^x must be an int32 or int64 tensor, got torch\.bool$"):
        check_index_range(torch.tensor([True]), "x", 0, 1)
    with pytest.raises(TypeError, match=r"^x must be an int64 tensor, got torch\.int32$"):
        check_index_range(torch.tensor([0], dtype=torch.int32), "x", 0, 1, dtypes=(torch.int64,))
    with pytest.raises(TypeError, match=r"^x must be a torch\.Tensor, got list$"):
        check_index_range([0], "x", 0, 1)
    assert check_index_range(torch.zeros(0, dtype=torch.long), "x", 5, 1).numel() == 0  # nothing to be out of range


# ---------------------------------------------------------------------------
# silent broadcasting and coercion
# ---------------------------------------------------------------------------


def _trl_batch():
    return torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64), torch.tensor([1, 2, 4])


@pytest.mark.parametrize("flag", ["no", "False", 0, 1, None, torch.tensor(False)])
def test_from_trl_reads_phantom_as_a_bool_not_by_truthiness(flag):
    """from_trl(..., phantom="no") returned the phantom layout (truthy string), phantom=None the other one; now TypeError."""
    r, v, n = _trl_batch()
    with pytest.raises(TypeError, match=r"^phantom must be a bool \(True or False\), got "):
        vtrl.from_trl(r, v, n, phantom=flag)
    assert torch.equal(vtrl.from_trl(r, v, n, phantom=np.bool_(False)).mask, vtrl.from_trl(r, v, n, phantom=False).mask)


@pytest.mark.parametrize("flag", ["no", 0, None])
def test_group_advantages_reads_normalise_as_a_bool(flag):
    """group_advantages(..., normalise="no") normalised anyway; normalise=None did not; now TypeError naming normalise."""
    with pytest.raises(TypeError, match=r"^normalise must be a bool \(True or False\), got "):
        ppo.group_advantages(torch.arange(4.0), torch.tensor([0, 0, 1, 1]), normalise=flag)


@pytest.mark.parametrize("gamma", [torch.full((1, 5), 0.9, dtype=torch.float64), torch.full((3, 5), 0.9, dtype=torch.float64),
                                   torch.full((3, 1), 0.9, dtype=torch.float64)])
def test_trl_advantages_does_not_broadcast_a_tensor_discount_over_the_rows(gamma):
    """trl_advantages with a (1, T) gamma applied one row's per-step discounts to every row (TRL's gamma is one number); now ValueError."""
    r, v, n = _trl_batch()
    with pytest.raises(ValueError, match=r"^gamma must be a number or a 0-d tensor; got shape"):
        vtrl.trl_advantages(r, v, n, gamma, 0.9)
    with pytest.raises(ValueError, match=r"^lam must be a number or a 0-d tensor; got shape"):
        vtrl.trl_advantages(r, v, n, 0.9, gamma)
    a0, r0 = vtrl.trl_advantages(r, v, n, torch.tensor(0.9, dtype=torch.float64), 0.9)
    a1, r1 = vtrl.trl_advantages(r, v, n, 0.9, 0.9)
    torch.testing.assert_close(a0, a1, rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device")
def test_trl_sequence_lengths_must_share_the_device_of_rewards():
    """sequence_lengths on the CPU with CUDA rewards failed inside torch.where; now a ValueError naming it."""
    r, v, n = _trl_batch()
    with pytest.raises(ValueError, match=r"^sequence_lengths must be on the device of the data"):
        vtrl.from_trl(r.cuda(), v.cuda(), n)


def test_from_torchrl_casts_nothing():
    """from_torchrl(state_value float64, reward float32) returned a batch of two dtypes; now TypeError naming state_value."""
    m = torch.ones(2, 3, dtype=torch.bool)
    kw = vtorchrl.to_torchrl(torch.randn(2, 3), torch.randn(2, 3), m)
    with pytest.raises(TypeError, match=r"^state_value must have the dtype of reward: torch\.float64 != torch\.float32$"):
        vtorchrl.from_torchrl(kw["state_value"].double(), kw["next_state_value"], kw["reward"], kw["done"], kw["terminated"])
    with pytest.raises(TypeError, match=r"^next_state_value must have the dtype of reward"):
        vtorchrl.from_torchrl(kw["state_value"], kw["next_state_value"].double(), kw["reward"], kw["done"], kw["terminated"])


def test_to_torchrl_refuses_a_bootstrap_it_would_ignore_and_names_the_shape_of_truncated():
    """to_torchrl(..., bootstrap=b) without truncated dropped b silently (gae_packed refuses the same call); now ValueError."""
    r, v, m = torch.randn(2, 3), torch.randn(2, 3), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"^bootstrap is given but truncated is not"):
        vtorchrl.to_torchrl(r, v, m, bootstrap=torch.zeros(2))
    with pytest.raises(ValueError, match=r"^truncated must have shape \(2,\), one flag per row, got \(2, 1\)$"):
        vtorchrl.to_torchrl(r, v, m, truncated=torch.ones(2, 1, dtype=torch.bool), bootstrap=torch.zeros(2))
    with pytest.raises(TypeError, match=r"^truncated must be a bool tensor, one flag per row$"):
        vtorchrl.to_torchrl(r, v, m, truncated=True, bootstrap=torch.zeros(2))


def test_scalars_that_valuelab_gae_refuses_are_refused_everywhere():
    """peers.verl_advantages(1, True, 0.95) handed True to verl as its gamma (1.0); now TypeError naming gamma, as vl.gae."""
    for bad, kind in ((True, "not bool"), (np.bool_(True), "not bool"), ("0.99", "got str")):
        with pytest.raises(TypeError, match=rf"^gamma must be a real number, {kind}$"):
            peers.verl_advantages(1, bad, 0.95)
        with pytest.raises(TypeError, match=r"^gamma must be a float or a tensor, "):
            vl.gae(torch.zeros(3), torch.zeros(3), gamma=bad)
    with pytest.raises(ValueError, match=r"^lam must lie in \[0, 1\], got 1\.5$"):
        peers.verl_advantages(1, 0.99, 1.5)
    with pytest.raises(TypeError, match=r"^quiet must be a bool \(True or False\), got str$"):
        peers.verl_run_ppo(quiet="no")


def test_check_scalar_and_check_flag():
    from valuelab._engine.checks import check_flag, check_nonnegative_scalar, check_scalar

    assert check_scalar(np.float32(0.5), "x") == 0.5 and check_scalar(3, "x") == 3.0
    for bad, msg in ((True, r"^x must be a real number, not bool$"), (np.bool_(False), r"^x must be a real number, not bool$"),
                     ("1", r"^x must be a real number, got str$"), (1j, r"^x must be a real number, got complex$"),
                     (torch.tensor(1.0), r"^x must be a real number, got Tensor$")):
        with pytest.raises(TypeError, match=msg):
            check_scalar(bad, "x")
    with pytest.raises(ValueError, match=r"^x must be finite"):
        check_scalar(10**400, "x")
    with pytest.raises(TypeError, match=r"^eps must be a real number, not bool$"):  # was "got bool": vl.gae's wording now
        check_nonnegative_scalar(True, "eps")
    assert check_flag(np.bool_(True), "f") is True and check_flag(False, "f") is False
    with pytest.raises(ValueError, match=r"^done must have the shape of reward, \(2,\), got \(1,\)$"):
        check_flag(torch.ones(1, dtype=torch.bool), "done", shape=(2,), like_name="reward")


def test_a_zero_d_tensor_rate_with_a_gradient_is_read_without_a_warning():
    import warnings

    from valuelab.integrations.verl import compute_gae_advantage_return

    r, v, m = torch.randn(2, 4), torch.randn(2, 4), torch.ones(2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # float() of a tensor that requires grad warned
        compute_gae_advantage_return(r, v, m, torch.tensor(0.9, requires_grad=True), 0.95)


def test_hole_convention_names_its_argument_for_a_non_string():
    """hole_convention([]) raised "unhashable type: 'list'"; now a TypeError naming name."""
    with pytest.raises(TypeError, match=r"^name must be a str, one of \('skip', 'zero'\), got list$"):
        vl.integrations.hole_convention([])


# ---------------------------------------------------------------------------
# labels and seeds
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("labels, got", [([-1, -1, 0, 0], -1), ([-3, -3, -3, -3], -3)])
def test_negative_group_labels_raise_a_value_error_naming_group(labels, got):
    """group=[-1, -1, 0, 0] raised IndexError "index out of range in self"; [-3] * 4 RuntimeError from torch.zeros."""
    with pytest.raises(ValueError, match=rf"^group must hold non-negative labels, got {got}$"):
        ppo.group_advantages(torch.arange(4.0), torch.tensor(labels))


@pytest.mark.parametrize("big", [2**40, INT64_MAX])
def test_huge_group_labels_allocate_nothing_large(big):
    """group=[2**40, 2**40, 0, 0] tried to allocate 4 TiB (torch.zeros(2**40 + 1)); 2**63 - 1 overflowed ``max + 1``.

    Labels are renumbered 0..K-1 first: the result is that of the labels [1, 1, 0, 0].
    """
    returns = torch.tensor([1.0, 3.0, 2.0, 6.0], dtype=torch.float64)
    got = ppo.group_advantages(returns, torch.tensor([big, big, 0, 0]))
    torch.testing.assert_close(got, ppo.group_advantages(returns, torch.tensor([1, 1, 0, 0])), rtol=0, atol=0)
    raw = ppo.group_advantages(returns, torch.tensor([7, 7, big, big]), normalise=False)
    torch.testing.assert_close(raw, torch.tensor([-1.0, 1.0, -2.0, 2.0], dtype=torch.float64), rtol=0, atol=0)


def _tiny_prompt_world():
    return policy.make_prompt_world(2, 3, 2)


SEEDED = {
    "seed_everything": (lambda s: vl.seed_everything(s), "seed"),
    "make_world": (lambda s: world.make_world(3, 2, seed=s), "seed"),
    "make_prompt_world": (lambda s: policy.make_prompt_world(2, 3, 2, seed=s), "seed"),
    "TinyTransformer": (lambda s: transformer.TinyTransformer(1, 3, 3, d_model=2, n_heads=1, d_ff=2, n_layers=1, seed=s), "seed"),
    "TinyCritic": (lambda s: critic.TinyCritic(3, 3, embed_dim=2, hidden_size=2, seed=s), "seed"),
    "world.sample": (lambda s: world.sample(world.make_world(3, 2), 2, s), "generator"),
    "sample_responses": (lambda s: policy.sample_responses(_tiny_prompt_world(), torch.as_tensor(
        _tiny_prompt_world().reference_policy())[None], 2, [s]), r"generators\[0\]"),
    "train_ppo": (lambda s: ppo.train_ppo(_tiny_prompt_world(), ppo.Arm("a"), [s], ppo.PPOConfig(
        iterations=1, samples_per_prompt=2, minibatches=1, epochs=1), device="cpu"), r"seeds\[0\]"),
    "train_many": (lambda s: ppo.train_many([(_tiny_prompt_world(), ppo.Arm("a"), ppo.PPOConfig(
        iterations=1, samples_per_prompt=2, minibatches=1, epochs=1))], [s], processes=1, device="cpu"), r"seeds\[0\]"),
    "distributed.demo_batch": (lambda s: distributed.demo_batch(s, rows=2, length=2), "seed"),
    "peers.demo_batch": (lambda s: peers.demo_batch(s, rows=2, length=4), "seed"),
}


@pytest.mark.parametrize("where", list(SEEDED))
@pytest.mark.parametrize("seed", [-1, 2**63, 2**64, 10**30])
def test_every_seed_argument_refuses_the_same_out_of_range_seeds_by_name(where, seed):
    """Before: -1 gave numpy's "expected non-negative integer" (make_world, make_prompt_world) or was accepted
    (seed_everything, TinyTransformer, ...); 2**64 gave torch's "Overflow when unpacking long long" or was accepted
    (make_world); now every one is ValueError "<name> must lie in [0, 2**63 - 1] ...". """
    call, name = SEEDED[where]
    with pytest.raises(ValueError, match=rf"^{name} must lie in \[0, 2\*\*63 - 1\]"):
        call(seed)


@pytest.mark.parametrize("where", ["seed_everything", "make_world", "make_prompt_world", "TinyTransformer", "TinyCritic",
                                   "world.sample", "distributed.demo_batch", "peers.demo_batch"])
def test_every_seed_argument_accepts_the_whole_range(where):
    """0, 2**63 - 1 and numpy ints are seeds everywhere (seed_everything refused np.int64(5))."""
    call, _ = SEEDED[where]
    for seed in (0, INT64_MAX, np.int64(5), np.uint64(7)):
        call(seed)


@pytest.mark.parametrize("where", list(SEEDED))
def test_seeds_of_the_wrong_type_are_type_errors_naming_the_argument(where):
    """distributed.demo_batch(True) and peers.demo_batch(1.0) raised torch's RuntimeError "manual_seed expected a long"."""
    call, name = SEEDED[where]
    for bad in (True, 1.0, "1"):
        with pytest.raises(TypeError, match=rf"^{name} must be an int"):
            call(bad)


def test_check_seed():
    from valuelab._engine.checks import SEED_MAX, check_seed

    assert SEED_MAX == INT64_MAX and check_seed(np.int64(3)) == 3 and check_seed(None, none_ok=True) is None
    with pytest.raises(TypeError, match=r"^s must be an int or None, got float$"):
        check_seed(0.0, "s", none_ok=True)
    with pytest.raises(ValueError, match=r"got an int of 16610 bits$"):  # str() of such an int would itself fail
        check_seed(10**5000)
