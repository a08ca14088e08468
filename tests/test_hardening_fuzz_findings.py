"""Issue 25: what the hypothesis suite (``tests/test_fuzz.py``) found after the first round of fixes.

Each test names the call the fuzzer found and what the library did with it
before the fix (a crash, a hang, a NaN from finite numbers, an input
changed, an error that named nothing the caller passed). The rule: a
correct finite result, or a TypeError/ValueError whose message names the
argument. Every test fails on the code of commit a396ba6 (checked with
``PYTHONPATH=<that commit's lib> pytest tests/test_hardening_fuzz_findings.py``; two of the size tests
are killed there by the kernel's out-of-memory killer), except the two guards that the fixes keep the
ordinary path as it was (``test_tile_is_one_copy_not_a_list_of_copies``,
``test_group_advantages_direct_path_unchanged``).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from valuelab import distributed, losses
from valuelab.lab import policy, ppo, stats, transformer
from valuelab.advantages import decoupled_gae, gae
from valuelab.integrations import torchrl, trl, verl
from valuelab.integrations._conventions import carry_into_holes, zero_holes
from valuelab.packed import packing
from valuelab.returns import td_targets
from valuelab.rewards import kl_shaped_rewards

F32, F64 = torch.float32, torch.float64


def _model(**kw):
    args = dict(d_model=2, n_layers=1, n_heads=1, d_ff=4, seed=0)
    args.update(kw)
    return transformer.TinyTransformer(3, 4, 3, **args)


# ---------------------------------------------------------------------------
# tensors with no data reaching an index op: the process died
# ---------------------------------------------------------------------------


def test_efficient_zero_token_ids_do_not_crash_the_process():
    """``final_scores`` / ``state_values`` with ``torch._efficientzerotensor`` ids: SIGSEGV before (the check
    materialised the zeros, the model read the original). Run in a child: a crash is a failed test, not a dead run."""
    code = """
        import torch
        from valuelab.lab import transformer
        m = transformer.TinyTransformer(1, 4, 3, d_model=2, n_layers=1, n_heads=1, d_ff=4, seed=0)
        z = torch._efficientzerotensor((1, 2, 3), dtype=torch.long)
        dense = torch.zeros((1, 2, 3), dtype=torch.long)
        assert torch.equal(transformer.state_values(m, z), transformer.state_values(m, dense))
        lz = torch._efficientzerotensor((2,), dtype=torch.long)
        try:
            transformer.final_scores(m, dense, lz)
        except ValueError as e:
            assert "lengths" in str(e), e
        else:
            raise AssertionError("lengths of 0 accepted")
        print("ok")
    """
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-800:])


def test_final_scores_checks_inputs_before_reading_its_shape():
    """``final_scores(inputs=tensor(0))``: IndexError (``inputs.shape[1]``) before."""
    with pytest.raises(ValueError, match="inputs"):
        transformer.final_scores(_model(), torch.tensor(0), torch.tensor([1]))


# ---------------------------------------------------------------------------
# sizes with no bound: a hang or an allocator error
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("call,name", [
    (lambda: transformer.tile(_model(), 2**31), "times"),
    (lambda: distributed.demo_batch(0, 2**31, 8), "rows"),
    (lambda: policy.make_prompt_world(vocab_size=2**31), "vocab_size"),
    (lambda: policy.make_prompt_world(max_len=2**31), "max_len"),
    (lambda: transformer.TinyTransformer(1, 4, 3, n_layers=np.uint64(2**64 - 1)), "n_layers"),
])
def test_sizes_beyond_memory_are_refused_by_name(call, name):
    """Before: MemoryError, PyTorch's "can't allocate 137438953472 bytes", numpy's "array is too big", or
    torch's "Overflow when unpacking long long"."""
    with pytest.raises(ValueError, match=name):
        call()


def test_sample_responses_refuses_samples_beyond_memory():
    w = policy.make_prompt_world(n_prompts=2, vocab_size=3, max_len=4, seed=0)
    probs = torch.full((1,) + w.state_shape + (3,), 1 / 3, dtype=F64)
    with pytest.raises(ValueError, match="samples_per_prompt"):
        policy.sample_responses(w, probs, 2**40, [0])


def test_tile_is_one_copy_not_a_list_of_copies():
    """``tile(times=5_044_308)`` of a tiny model ran past the fuzzer's 10 s (a Python list of five million
    tensors for ``torch.cat``); one ``repeat`` per parameter is the same result."""
    m = _model()
    t = transformer.tile(m, 3)
    for name, p in m.named_parameters():
        axis = 1 if name in transformer.TinyTransformer.LAYER_PARAMS else 0
        assert torch.equal(getattr(t, name), torch.cat([p.detach()] * 3, dim=axis))


# ---------------------------------------------------------------------------
# silent broadcasting and coercion
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("call,name", [
    (lambda: losses.aggregate(torch.tensor(0.0), torch.zeros(1, 2)), "per_token"),  # broadcast before
    (lambda: losses.aggregate(torch.ones(1, 2), torch.ones(1)), "mask"),  # broadcast before
    (lambda: losses.aggregate(torch.ones(2), torch.tensor([-4.0, 1.0])), "mask"),  # a mask of -4 weighed -4
    (lambda: losses.masked_whiten(torch.arange(3.0), shift_mean=0), "shift_mean"),  # read as False
    (lambda: losses.masked_whiten(torch.arange(3.0), shift_mean=None), "shift_mean"),
    (lambda: packing(torch.tensor([0, 1]), True), "n_tokens"),  # True read as one token
    (lambda: policy.count_good(np.arange(3), np.arange(3), True), "scale"),
    (lambda: policy.count_good(np.arange(3), np.arange(3), None), "scale"),
    (lambda: stats.mean_ci(["788.8", 6.7e-255]), "x"),  # the string parsed as a number
    (lambda: stats.mean_ci(np.array(["1", "2"])), "x"),
    (lambda: stats.mean_ci(np.array([1 + 1j, 2.0])), "x"),  # numpy dropped the imaginary part
    (lambda: stats.t_quantile([0.5], 1), "p"),  # "unhashable type: 'list'"
    (lambda: losses.masked_mean(torch.ones(2, 3), dim=2), "dim"),  # IndexError
])
def test_coercions_are_refused_by_name(call, name):
    with pytest.raises((TypeError, ValueError), match=rf"^{name}\b"):
        call()


def test_aggregate_ignores_masked_entries_and_overflows_loudly():
    assert float(losses.aggregate(torch.tensor([1.0, float("nan")]), torch.tensor([True, False]))) == 1.0
    with pytest.raises(ValueError, match="per_token"):
        losses.aggregate(torch.tensor([1e308, 1e308], dtype=F64), torch.ones(2, dtype=F64))  # inf before


def test_t_quantile_cache_does_not_answer_unchecked_keys():
    """``(Decimal('0.5'), 1)`` and ``(0.5, np.True_)`` hash as ``(0.5, 1)``: a cached answer came back unchecked."""
    from decimal import Decimal

    assert stats.t_quantile(0.5, 1) == 0.0
    with pytest.raises(ValueError, match="p"):
        stats.t_quantile(Decimal("0.5"), 1)
    with pytest.raises(ValueError, match="df"):
        stats.t_quantile(0.5, np.True_)
    assert stats.t_quantile(np.float64(0.975), np.int64(9)) == stats.t_quantile(0.975, 9)  # numpy numbers are numbers


def test_pm_takes_numpy_ints_and_refuses_absurd_decimals():
    ci = stats.mean_ci([1.0, 2.0, 3.0])
    assert stats.pm(ci, np.int64(2)) == stats.pm(ci, 2)
    with pytest.raises(ValueError, match="decimals"):
        stats.pm(ci, 2**63)  # "Too many decimal digits in format string" before


def test_count_good_refuses_zero_scale():
    """``scale = 0``: NaN (0/0) before."""
    with pytest.raises(ValueError, match="scale"):
        policy.count_good(np.arange(3), np.arange(3), 0)
    assert np.array_equal(policy.count_good(np.arange(4), None, 2), np.array([0, 0.5, 1, 1]))


# ---------------------------------------------------------------------------
# silent NaN and inf from finite inputs
# ---------------------------------------------------------------------------


def test_verl_whiten_with_zero_eps_is_not_nan():
    """Every valid entry equal and ``eps = 0``: 0 * inf = NaN before; now the centred values."""
    out = verl.whiten(torch.zeros(1, 2), torch.ones(1, 2), eps=0.0)
    assert torch.equal(out, torch.zeros(1, 2))
    out = verl.whiten(torch.zeros(1, 2, dtype=torch.float16), torch.ones(1, 2), eps=1e-8)  # eps rounds to 0 in float16
    assert torch.isfinite(out).all()


def test_verl_whiten_does_not_overflow_float32():
    """``[3e38, -3e38]``: the variance overflowed float32 (a ValueError naming ``x``, no argument of whiten)."""
    out = verl.whiten(torch.tensor([[3e38, -3e38, 5.0]]), torch.tensor([[1, 1, 0]]))
    assert torch.allclose(out[0, :2], torch.tensor([0.5**0.5, -(0.5**0.5)]), rtol=1e-6)
    assert abs(float(out[0, 2])) < 1e-30  # the masked 5 whitened: (5 - 0) / 4.2e38, not -inf


def test_verl_gae_masked_overflow_is_gone():
    """float32 reward 1e38 with mask [1, 1, 0], gamma = lam = 0: -inf at the masked position before."""
    adv, ret = verl.compute_gae_advantage_return(torch.tensor([[1e38, 0.0, 0.0]]), torch.zeros(1, 3),
                                                 torch.tensor([[1.0, 1.0, 0.0]]), 0.0, 0.0)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert torch.allclose(adv, torch.tensor([[0.5**0.5, -(0.5**0.5), -(0.5**0.5)]]), rtol=1e-6)


@pytest.mark.parametrize("returns,group,want", [
    ([0.0, 0.0], [0, 0], [0.0, 0.0]),  # eps = 0, no spread: 0/0 = NaN before
    ([65504.0, -1.4, -1e20], [0, 0, 0], [0.57735, 0.57735, -1.1547]),  # the variance overflowed float32: zeros before
])
def test_group_advantages_never_nan_never_zeroed(returns, group, want):
    out = ppo.group_advantages(torch.tensor(returns), torch.tensor(group), eps=0.0)
    assert torch.allclose(out, torch.tensor(want), atol=1e-4)


def test_group_advantages_direct_path_unchanged():
    """The fallback is only taken where the formula fails: ordinary inputs give the formula's bits."""
    r, g = torch.tensor([1.0, 2.0, 3.0, 5.0, 4.0]), torch.tensor([0, 0, 1, 1, 1])
    n = torch.tensor([2.0, 3.0])
    mean = torch.zeros(2).index_add_(0, g, r) / n
    c = r - mean[g]
    sd = (torch.zeros(2).index_add_(0, g, c * c) / (n - 1)).sqrt() + 1e-6
    assert torch.equal(ppo.group_advantages(r, g), c / sd[g])


def test_torchrl_gae_overflow_is_an_error_not_inf():
    """rewards 1e308 with gamma = lmbda = 1: +inf advantages before (vl.gae refused the same sums)."""
    z = torch.zeros(3, 1, dtype=F64)
    with pytest.raises(ValueError, match="reward"):
        torchrl.generalized_advantage_estimate(1.0, 1.0, z, z, torch.full((3, 1), 1e308, dtype=F64),
                                               torch.zeros(3, 1, dtype=torch.bool))


@pytest.mark.parametrize("call,name", [
    (lambda: gae(torch.zeros(2), torch.zeros(2), bootstrap=1e308), "bootstrap"),
    (lambda: td_targets(torch.zeros(2), torch.zeros(2), bootstrap=1e300), "bootstrap"),
    (lambda: kl_shaped_rewards(torch.zeros(1, 2), torch.zeros(1, 2), 1e300), "score"),
])
def test_scalars_beyond_the_dtype_are_named(call, name):
    """``torch.full`` raised RuntimeError "value cannot be converted to type float without overflow" before."""
    with pytest.raises(ValueError, match=name):
        call()


# ---------------------------------------------------------------------------
# inputs changed, contracts broken quietly
# ---------------------------------------------------------------------------


def test_batch_statistics_leaves_the_callers_grad_alone():
    """``values`` that requires grad: its ``.grad`` was written (the copy was a clone in the caller's graph)."""
    values, returns, old, mask = distributed.demo_batch(0, 3, 4)
    values = values.clone().requires_grad_(True)
    distributed.batch_statistics(values, returns, old, mask)
    assert values.grad is None


@pytest.mark.parametrize("kw,name", [
    (dict(old=torch.tensor([[0.0, float("nan")]], dtype=F64)), "old"),  # "old_values must be finite" before
    (dict(returns=torch.tensor([[6, 6]], dtype=torch.int16)), "returns"),  # "x must have a floating dtype" before
])
def test_batch_statistics_names_its_own_arguments(kw, name):
    args = dict(values=torch.zeros(1, 2, dtype=F64), returns=torch.zeros(1, 2, dtype=F64), old=torch.zeros(1, 2, dtype=F64),
                mask=torch.ones(1, 2, dtype=torch.bool))
    args.update(kw)
    with pytest.raises((TypeError, ValueError), match=rf"^{name}\b"):
        distributed.batch_statistics(**args)


def test_batch_statistics_names_returns_when_its_variance_overflows():
    """The long profile's find: float32 returns ``[-7e16, -3e16, 3.4e38]``; the statistics said "x: its variance
    exceeds the largest torch.float32", naming masked_var's argument, not batch_statistics'."""
    args = dict(values=torch.zeros(1, 3), returns=torch.tensor([[-7.17e16, -3.1e16, 3.4e38]]), old=torch.zeros(1, 3),
                mask=torch.ones(1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^returns: its variance exceeds"):
        distributed.batch_statistics(**args)


def test_a_size_too_large_for_a_float_is_still_named():
    """``demo_batch(rows=10**400)``: OverflowError while formatting the size check's own message."""
    with pytest.raises(ValueError, match=r"^rows: the call needs about 2\*\*"):
        distributed.demo_batch(0, 10**400, 2)


def test_clip_ranges_past_the_dtype_clip_nothing():
    """``clip_range = 1.8e308`` on float32: torch's RuntimeError "value cannot be converted to type float without
    overflow" from ``clamp`` (value_loss, policy_loss); a range no float32 reaches clips nothing."""
    v, r, o = torch.tensor([0.0, 0.36, -0.04]), torch.tensor([2.79, 0.0, 2.79]), torch.full((3,), 1.63)
    assert torch.equal(losses.value_loss(v, r, old_values=o, clip_range=1.7976931348623157e308), losses.value_loss(v, r))
    lp, old_lp, adv = torch.zeros(3), torch.full((3,), 0.1), torch.tensor([1.0, -1.0, 0.0])
    big = ppo.policy_loss(lp, old_lp, adv, clip_range=1.7e308).loss
    want = -(torch.exp(lp - old_lp) * adv).mean()
    assert torch.allclose(big, want)


def test_count_good_in_float64_whatever_the_count():
    """float32 counts: float32 arithmetic (1.0 for 42.18258 / 42.182580134, where the answer is 0.99999997); a scale of
    5e-324 rounded to 0 in float32 (NaN), and an overflowing ratio came back as -inf."""
    assert count_good_f64(np.float32(42.18258), 42.182580134228665) == pytest.approx(0.9999999740722043, rel=1e-15)
    assert count_good_f64(np.float32(23.5), 5e-324) == 1.0
    with pytest.raises(ValueError, match="^scale"):
        policy.count_good(np.float32(-1.6e16), None, 5e-324)


def count_good_f64(count, scale):
    out = policy.count_good(count, None, scale)
    assert np.asarray(out).dtype == np.float64
    return float(out)


def test_train_many_refuses_jobs_that_are_not_a_list():
    """``train_many(jobs=np.int8(-110))``: "'numpy.int8' object is not iterable", naming nothing."""
    with pytest.raises(TypeError, match="^jobs"):
        ppo.train_many(np.int8(-110), [1], processes=1)


def test_to_torchrl_refuses_values_of_another_dtype():
    """float32 rewards with float16 values gave a dict TorchRL's GAE (and valuelab's) then refuses."""
    r, v, m = torch.zeros(1, 2), torch.zeros(1, 2, dtype=torch.float16), torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(TypeError, match="^values"):
        torchrl.to_torchrl(r, v, m)


def test_a_missing_score_is_not_a_score_of_zero():
    """``kl_shaped_rewards(score=None)`` gave the rewards of a score 0."""
    with pytest.raises(TypeError, match="^score"):
        kl_shaped_rewards(torch.zeros(1, 2), torch.zeros(1, 2), None)


def test_a_margin_no_float_holds_is_refused_by_name():
    """``equivalence(x, margin=-10**400)``: OverflowError "int too large to convert to float"."""
    with pytest.raises(ValueError, match="margin"):
        stats.equivalence([0.1, 0.2, 0.3], -(10**400))


def test_freed_lengths_are_refused_before_a_view_is_taken():
    """``final_scores`` with a freed ``lengths``: torch's RuntimeError "setStorage ... out of bounds" from ``expand``."""
    lengths = torch.tensor([2, 1])
    lengths.untyped_storage().resize_(0)
    with pytest.raises(ValueError, match="^lengths"):
        transformer.final_scores(_model(), torch.zeros(3, 2, 3, dtype=torch.long), lengths)


def test_run_on_ranks_bounds_its_processes():
    """``world_size = 2**64``: OverflowError "cannot fit 'int' into an index-sized integer" from spawn."""
    with pytest.raises(ValueError, match="^world_size"):
        distributed.run_on_ranks(distributed.shard_statistics, 2**64)


@pytest.mark.parametrize("fn", [zero_holes, carry_into_holes])
def test_hole_conventions_need_a_mask(fn):
    """``zero_holes(x, None)`` read None as "no holes"; these functions are about holes: None is refused."""
    with pytest.raises(TypeError, match="^mask"):
        fn(torch.zeros(3), None)


def test_from_trl_moving_the_score_does_not_overflow_silently():
    """``phantom=False`` adds the score to the last token's KL term: 1.8e308 + 1.8e308 came back as +inf."""
    with pytest.raises(ValueError, match="^rewards"):
        trl.from_trl(torch.full((1, 3), 1.7976931348623157e308, dtype=F64), torch.zeros(1, 3, dtype=F64),
                     torch.tensor([0]), phantom=False)


def test_an_unsigned_margin_is_not_negated_around():
    """``margin = np.uint64(2**64 - 1)``: ``-margin`` wrapped around to 1, so every interval was "not equivalent"."""
    assert stats.equivalence([1.0, 0.0], np.uint64(2**64 - 1), alpha=0.25).equivalent
    assert stats.equivalence([0.01, -0.01, 0.0], np.uint64(1)).equivalent


def test_efficient_zero_rows_do_not_crash_sequence_inputs():
    """``sequence_inputs(rows=torch._efficientzerotensor(...))``: SIGSEGV (the check read a copy, the index the original)."""
    code = """
        import torch
        from valuelab.lab import policy, transformer
        w = policy.make_prompt_world(n_prompts=1, vocab_size=4, max_len=2, seed=0)
        probs = torch.as_tensor(w.reference_policy())[None]
        b = policy.sample_responses(w, probs, 2, [0])
        z = torch._efficientzerotensor((1, 2), dtype=torch.long)
        assert torch.equal(transformer.sequence_inputs(w, b, z), transformer.sequence_inputs(w, b, torch.zeros(1, 2, dtype=torch.long)))
        print("ok")
    """
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-800:])


def test_equal_entries_whiten_to_zero_at_any_magnitude():
    """1,500 entries all equal to -4.7e287: the mean's rounding (1 ulp) divided by the spread it made whitened to +-1
    (eps / s**2 underflows at that scale, so nothing damped it); the corrected two-pass mean is exact for equal
    entries."""
    x = torch.full((1, 1500), -4.685957499849568e287, dtype=F64)
    assert torch.equal(losses.masked_whiten(x), torch.zeros_like(x))
    assert torch.equal(verl.whiten(x, torch.ones_like(x, dtype=torch.bool)), torch.zeros_like(x))


@pytest.mark.parametrize("call", [
    lambda: verl.whiten(torch.zeros(3), None),
    lambda: losses.aggregate(torch.zeros(1, 2), None),
    lambda: verl.compute_gae_advantage_return(torch.zeros(1, 3), torch.zeros(1, 3), None, 1.0, 0.95),
])
def test_required_masks_refuse_none(call):
    """verl's masked_whiten and GAE and aggregate take a mask with no default: None was read as "every token"."""
    with pytest.raises(TypeError, match="mask must be a torch.Tensor, got None"):
        call()


def test_shard_statistics_outside_a_group_is_refused():
    """Outside a process group it returned this rank's own statistics as if they were the group's."""
    with pytest.raises(ValueError, match="world_size"):
        distributed.shard_statistics(1, 2, [1, 1], 3)


def test_an_error_inside_a_rank_comes_back_as_that_error():
    """``run_on_ranks(shard_statistics, 2, [2, 3], 'token-mean')``: ProcessRaisedException before."""
    with pytest.raises(TypeError, match=r"fn raised on rank 0 of 2: seed must be an int"):
        distributed.run_on_ranks(distributed.shard_statistics, 2, [2, 3], "token-mean")


@pytest.mark.parametrize("device", [np.int8(99), 99])
def test_devices_are_checked_by_name(device):
    """``train_many(device=np.int8(99))``: torch's "Cannot access accelerator device" before."""
    from valuelab.lab.world import make_world, sample

    with pytest.raises(TypeError, match="device"):
        sample(make_world(max_len=3, seed=0), 2, 0, device=device)


def test_devices_that_do_not_exist_are_refused():
    from valuelab._engine.checks import check_device

    assert check_device("cpu") == torch.device("cpu")
    for bad in ("tpu", "gpu7", "meta", "cuda:99" if torch.cuda.is_available() else "cuda"):
        with pytest.raises(ValueError, match="device"):
            check_device(bad)


def test_kappa_of_a_tiny_world_is_nan_not_an_error():
    """The fuzzer's valid call: one prompt, ``max_len`` 2, 2 samples, ``early`` 1. The exact advantages have no
    spread at the first token, and train_ppo died with "exact: the exact advantages have no spread", naming no
    argument of train_ppo. kappa is not defined there: NaN, as the documentation of PPOHistory.kappa says."""
    with pytest.raises(ValueError, match="no spread"):  # advantage_fit itself still refuses
        ppo.advantage_fit(torch.tensor([[0.1, 0.2]]), torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool), 2)
    w = policy.make_prompt_world(n_prompts=1, vocab_size=3, max_len=2, eos_range=(0.6967089106150476, 0.9414776756294007),
                                 beta=1.0, gamma=0.0, logit_scale=3.0, seed=1977)
    arm = ppo.Arm("arm", estimator="group", lam_actor=1.0, lam_critic=0.95, alpha=2)
    config = ppo.PPOConfig(iterations=2, samples_per_prompt=2, epochs=1, minibatches=1, whiten=False, early=1)
    h = ppo.train_ppo(w, arm, [7199], config, device="cpu")
    assert np.isnan(h.kappa).any() and np.isfinite(h.objective).all()
    assert np.array_equal(np.isnan(h.kappa), np.isnan(h.noise))


# ---------------------------------------------------------------------------
# messages that named the wrong parameter
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kw,name", [
    (dict(lam_critic=-1e-9), "lam_critic"), (dict(lam_actor=1.5), "lam_actor"), (dict(lam_actor="0.9"), "lam_actor"),
])
def test_decoupled_gae_names_which_lambda(kw, name):
    """"lam must lie in [0, 1]" before: decoupled_gae has no parameter lam."""
    with pytest.raises((TypeError, ValueError), match=rf"^{name}\b"):
        decoupled_gae(torch.zeros(1, 2), torch.zeros(1, 2), **kw)


def test_trainer_adapters_name_their_own_mask():
    """TRL: "mask must select at least two entries" (TRL's function has no mask); verl: the same for response_mask."""
    with pytest.raises(ValueError, match="sequence_lengths"):
        trl.trl_advantages(torch.zeros(1, 3), torch.zeros(1, 3), torch.tensor([0]), 1.0, 0.95)
    with pytest.raises(ValueError, match="response_mask"):
        verl.compute_gae_advantage_return(torch.zeros(1, 3), torch.zeros(1, 3), torch.zeros(1, 3), 1.0, 1.0)


def test_sample_responses_names_the_generators_argument():
    w = policy.make_prompt_world(n_prompts=1, vocab_size=3, max_len=2, seed=0)
    probs = torch.full((1,) + w.state_shape + (3,), 1 / 3, dtype=F64)
    with pytest.raises(ValueError, match=r"generators\[0\]"):
        policy.sample_responses(w, probs, 2, [-1])


def test_mean_ci_reads_negative_views():
    """``z.conj().imag`` is a view with the negative bit set: numpy() refused it (RuntimeError) before."""
    z = torch.tensor([1 + 2j, 3 + 1j, 0 + 5j], dtype=torch.complex128).conj().imag  # float64: .double() keeps the bit
    assert stats.mean_ci(z).mean == pytest.approx(-8 / 3)


@pytest.mark.parametrize("clip_range", [None, 0.2])
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_value_loss_gradient_is_zero_not_nan_at_a_huge_masked_return(aggregation, clip_range):
    """A masked return of 1e308: ``2 (V - G)`` overflows to -inf, and the masked gradient was 0 * inf = NaN."""
    v = torch.zeros(1, 3, dtype=F64, requires_grad=True)
    g = torch.tensor([[0.0, 1.0, 1e308]], dtype=F64)
    m = torch.tensor([[True, True, False]])
    losses.value_loss(v, g, mask=m, old_values=torch.zeros_like(g), clip_range=clip_range,
                      aggregation=aggregation).backward()
    assert torch.isfinite(v.grad).all() and float(v.grad[0, 2]) == 0.0
    assert float(v.grad[0, 1]) == pytest.approx(-1.0 if aggregation == "seq-mean-token-sum" else -0.5)


def test_explained_variance_of_equal_targets_is_undefined_at_any_magnitude():
    """Six equal targets of 1.77e16: the one-pass mean was an ulp off, so the 'spread' was positive and an EV came back."""
    t = torch.full((6,), 1.7736693088322292e16, dtype=F64)
    with pytest.raises(ValueError, match="target"):
        transformer.explained_variance(t.clone(), t, torch.ones(6, dtype=torch.bool), dim=0)
    assert float(losses.masked_var(t, torch.ones(6, dtype=torch.bool), unbiased=False)) == 0.0


def test_a_meta_tensor_inside_a_sample_list_is_refused_by_name():
    """NotImplementedError "Cannot copy out of meta tensor" before: a 0-d meta tensor in the list was copied out of."""
    with pytest.raises(ValueError, match=r"^b\[1\]"):
        stats.paired_ci([1.0, 2.0, 3.0], [1.0, torch.tensor(2, dtype=torch.int16, device="meta"), 0.5])


@pytest.mark.parametrize("world_size", [2, 2**31])
def test_shard_statistics_refuses_a_freed_tensor_for_sizes_without_reading_it(world_size):
    """SIGSEGV before: the error message printed the repr of a freed tensor (its storage resized to 0)."""
    sizes = torch.tensor([0.0, 0.0, 0.0])
    sizes.untyped_storage().resize_(0)
    with pytest.raises(TypeError, match=r"^sizes .*a tensor of shape \(3,\)"):
        distributed.shard_statistics(0, world_size, sizes, 293)
