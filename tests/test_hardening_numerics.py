"""Issue 25: loops with no bound, silent NaN and inf, contracts broken quietly.

One section per class of defect. Each test names the input that used to
fail and what the code before the fix did with it: a loop that never ended,
an inf or NaN returned from finite numbers (or an error that named the
wrong thing), a documented promise not kept. The rule each test holds the
code to: finite inputs give a correct finite result or a ValueError naming
the argument; every loop ends; a switch, a count or a result means what
its documentation says.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import valuelab as vl
from valuelab import distributed, losses
from valuelab.lab import policy, ppo, stats, transformer, world
from valuelab.lab.stats import t_quantile

F64 = torch.float64


def _run_isolated(code: str, timeout: float = 120, env: dict = None) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter, killed after ``timeout`` s: a hang there is a failed test here, not a stuck run."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=None if env is None else dict(os.environ, **env))


# ---------------------------------------------------------------------------
# loops with no bound: stats.t_quantile
# ---------------------------------------------------------------------------

# Inside the documented domain (0.5 <= p < 1, any integer df >= 1), each of these never returned: the
# bracketing loop `while cdf(hi) < p - 1/2: hi *= 2` waited for a numerical central integral to reach
# 1/2 - 1.1e-16 (p = 1 - 2**-53), which rounding never allows, or for a density constant that
# lgamma(df/2 + 1/2) - lgamma(df/2) had cancelled to 0 (df >= 1e17); hi doubled up to inf and on.
HANGING = [(1 - 2**-53, 1), (1 - 2**-53, 30), (0.975, 10**17), (0.975, 10**300), (0.975, 10**400)]


def test_t_quantile_ends_for_arguments_that_used_to_hang():
    proc = _run_isolated(f"""
        import json
        from valuelab.lab.stats import t_quantile
        print(json.dumps([t_quantile(p, df) for p, df in {HANGING!r}]))
    """, timeout=90)  # the old code: subprocess.TimeoutExpired
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])
    scipy_stats = pytest.importorskip("scipy.stats")
    for (p, df), q in zip(HANGING, got):
        want = scipy_stats.t.isf(1 - p, min(df, 1e18))  # the upper tail, exact in floats for p near 1
        assert q == pytest.approx(want, rel=1e-9), (p, df)


def test_t_quantile_for_a_huge_df_is_the_normal_quantile():
    # df = 1e12: the old density constant lost 1e-3 to cancellation, and t_quantile(0.975, 10**12)
    # was 1.96148 instead of 1.95996 (the normal quantile, to 1e-12).
    assert t_quantile(0.975, 10**12) == pytest.approx(1.959963984540054, rel=1e-10)
    assert t_quantile(0.975, 10**6) == pytest.approx(1.959966, rel=1e-6)


@pytest.mark.parametrize("df", [1, 2, 3, 5, 30, 64, 65, 1000])
@pytest.mark.parametrize("p", [0.5000001, 0.75, 0.9995, 1 - 1e-7, 1 - 1e-11])
def test_t_quantile_is_accurate_far_in_the_tail(p, df):
    # p = 1 - 1e-11 at df = 1: the old quantile was 3.18314e10 against 3.18310e10 (the tail taken as
    # 1/2 minus the central integral keeps only 5 digits there)
    scipy_stats = pytest.importorskip("scipy.stats")
    assert t_quantile(p, df) == pytest.approx(scipy_stats.t.isf(1 - p, df), rel=1e-9)


def test_every_loop_of_stats_is_bounded():
    """No `while` in stats: the bisections are `for` loops of at most 200 steps."""
    assert "while " not in inspect.getsource(stats)


# ---------------------------------------------------------------------------
# silent NaN and inf: stats
# ---------------------------------------------------------------------------


def test_mean_ci_of_huge_equal_numbers_is_finite():
    # old: a.mean() of [1e308, 1e308] overflowed: Interval(mean=inf, lo=nan, hi=inf, half=inf)
    ci = vl.mean_ci([1e308, 1e308])
    assert (ci.mean, ci.lo, ci.hi, ci.half) == (1e308, 1e308, 1e308, 0.0)


def test_mean_ci_of_huge_numbers_is_the_t_interval():
    # old: [1e200, 3e200, 2e200] gave lo = -inf, hi = inf (the squares overflowed in std)
    x = [1e200, 3e200, 2e200]
    ci = vl.mean_ci(x)
    scaled = vl.mean_ci([1.0, 3.0, 2.0])
    assert ci.mean == pytest.approx(2e200) and ci.half == pytest.approx(scaled.half * 1e200, rel=1e-12)
    assert np.isfinite([ci.lo, ci.hi]).all()


def test_an_interval_beyond_the_largest_float_is_refused_by_name():
    # old: mean_ci([1e308, -1e308]) returned Interval(mean=0.0, lo=-inf, hi=inf, half=inf)
    with pytest.raises(ValueError, match=r"^x: the 0\.95 interval of its mean overflows float64"):
        vl.mean_ci([1e308, -1e308])
    # old: 0.5 + level / 2 rounded to 1 and the error named p, an argument the caller never gave
    with pytest.raises(ValueError, match=r"^level must be a number in \(0, 1\) below 1 - 1\.2e-16"):
        vl.mean_ci([0.0, 1.0], level=1 - 2**-53)


def test_paired_ci_names_the_difference_that_overflows():
    # old: ValueError("x must be finite; entry 0 is inf"): x is no argument of paired_ci
    with pytest.raises(ValueError, match=r"^a - b overflows float64 at entry 0"):
        vl.paired_ci([1e308, 0.0], [-1e308, 1.0])


def test_equivalence_of_huge_equal_numbers_is_finite():
    # old: Equivalence(interval=Interval(mean=inf, lo=nan, ...), equivalent=False)
    e = stats.equivalence([1e308, 1e308], 1.0)
    assert e.interval.mean == 1e308 and e.interval.half == 0.0 and not e.equivalent
    with pytest.raises(ValueError, match="^alpha must"):  # old: the error named level
        stats.equivalence([0.0, 1.0], 1.0, alpha=1e-17)


# ---------------------------------------------------------------------------
# silent NaN and inf: masked statistics and the value loss
# ---------------------------------------------------------------------------


def test_masked_mean_of_huge_numbers_is_finite():
    # old: the scale multiplied the sum, not the mean: s * 2 / 2 = inf for [1e308, 1e308]
    x = torch.tensor([1e308, 1e308], dtype=F64)
    assert float(vl.masked_mean(x)) == 1e308
    assert float(vl.masked_mean(x[None], dim=-1)[0]) == 1e308


def test_a_huge_masked_entry_never_reaches_the_mean():
    # old: the scale came from the valid entries (1e-300) and the masked 1e300 / 1e-300 = inf, times 0: NaN
    x = torch.tensor([1e-300, 1e300], dtype=F64)
    assert float(vl.masked_mean(x, torch.tensor([True, False]))) == 1e-300


def test_masked_var_of_huge_numbers():
    # old: [1e308, 1e308] had variance inf (the sum overflowed); float32 [3e38, -3e38] gave inf
    assert float(losses.masked_var(torch.tensor([1e308, 1e308], dtype=F64))) == 0.0
    assert float(losses.masked_var(torch.tensor([1e308, 1e308], dtype=F64), unbiased=False)) == 0.0
    assert float(losses.masked_var(torch.tensor([1e150, -1e150], dtype=F64))) == pytest.approx(2e300)
    with pytest.raises(ValueError, match=r"^x: its variance exceeds the largest torch\.float32"):
        losses.masked_var(torch.tensor([3e38, -3e38]))


def test_biased_whitening_of_huge_numbers_is_finite():
    # old: unbiased=False took the unscaled path: [1e308, 1e308, -1e308] whitened to NaN
    x = torch.tensor([1e308, 1e308, -1e308], dtype=F64)
    got = vl.masked_whiten(x, unbiased=False)
    want = vl.masked_whiten(torch.tensor([1.0, 1.0, -1.0], dtype=F64), unbiased=False)
    torch.testing.assert_close(got, want)


def test_value_loss_ignores_a_masked_error_that_overflows():
    # old: the masked squared error (2e200)^2 = inf met the 0 of the mask: inf * 0 = NaN, and value_loss
    # raised "values and returns are finite but differ too much" for a token that is not in the loss
    values = torch.tensor([0.0, 1.0, 1e200], dtype=F64, requires_grad=True)
    returns = torch.tensor([1.0, 3.0, -1e200], dtype=F64)
    mask = torch.tensor([True, True, False])
    loss = vl.value_loss(values, returns, mask=mask)
    assert float(loss.detach()) == pytest.approx(0.5 * (1 + 4) / 2)
    loss.backward()
    assert torch.isfinite(values.grad).all() and float(values.grad[2]) == 0.0
    st = vl.value_loss_stats(values.detach(), returns, mask=mask)
    assert float(st.explained_variance) == pytest.approx(1 - 0.25 / 1.0)


def test_explained_variance_beyond_the_largest_float_is_refused():
    # old: returns with a spread of 1e-150 and errors of 1e5: Var ratio 1e310 = inf, explained variance -inf
    g = torch.tensor([1e-150, -1e-150, 0.0], dtype=F64)
    v = torch.tensor([1e5, -1e5, 0.0], dtype=F64)
    with pytest.raises(ValueError, match=r"^values: its errors are so much larger"):
        vl.value_loss_stats(v, g)


def test_global_count_below_the_local_count_is_refused():
    # old: global_count=1 with 4 valid tokens was taken: the loss of this rank alone came out 4 times too large
    x = torch.zeros(4)
    with pytest.raises(ValueError, match=r"^global_count must be at least this rank's count of valid tokens \(4\)"):
        vl.value_loss(x, torch.ones(4), global_count=1)
    with pytest.raises(ValueError, match=r"count of non-empty sequences \(2\)"):
        vl.value_loss(torch.zeros(2, 3), torch.ones(2, 3), global_count=1.5, aggregation="seq-mean-token-mean")
    assert float(vl.value_loss(x, torch.ones(4), global_count=8)) == pytest.approx(0.25)


# ---------------------------------------------------------------------------
# silent NaN and inf: transformer.explained_variance, ppo
# ---------------------------------------------------------------------------


def test_explained_variance_refuses_nan_and_inf():
    y = torch.tensor([1.0, 2.0, 3.0])
    m = torch.tensor([True, False, True])
    # old: a NaN at a masked position gave nan (NaN * 0 in the sums)
    with pytest.raises(ValueError, match=r"^prediction must be finite.*that position is masked"):
        transformer.explained_variance(torch.tensor([1.0, float("nan"), 2.0]), y, m)
    # old: an inf prediction gave nan
    with pytest.raises(ValueError, match=r"^prediction must be finite"):
        transformer.explained_variance(torch.tensor([1.0, float("inf"), 2.0]), y, torch.ones(3, dtype=torch.bool))
    # old: float32 predictions of +-3e38 gave -inf
    with pytest.raises(ValueError, match=r"^prediction: its errors are so much larger"):
        transformer.explained_variance(torch.tensor([3e38, -3e38, 2.0]), y, torch.ones(3, dtype=torch.bool))


def test_explained_variance_of_huge_numbers_is_finite():
    # old: float64 targets near 1e308 overflowed in the squares: nan
    y = torch.tensor([1e308, -1e308, 0.0], dtype=F64)
    p = torch.tensor([0.9e308, -0.9e308, 0.0], dtype=F64)
    got = float(transformer.explained_variance(p, y, torch.ones(3, dtype=torch.bool)))
    assert got == pytest.approx(0.99, rel=1e-12)


def test_policy_ratio_that_overflows_is_refused_by_name():
    # old: log-ratio 100 in float32 (1000 in float64) with a negative advantage: loss = inf
    for dtype, big in ((torch.float32, 100.0), (F64, 1000.0)):
        lp = torch.tensor([big, 0.0], dtype=dtype)
        with pytest.raises(ValueError, match=r"^logprobs: the ratio exp\(logprobs - old_logprobs\) overflows"):
            ppo.policy_loss(lp, torch.zeros(2, dtype=dtype), torch.tensor([-1.0, 1.0], dtype=dtype))


def test_a_clipped_huge_ratio_has_a_finite_loss_and_gradient():
    # old: log-ratio 100 with a positive advantage: the loss was (1 + eps) A, but exp(100) = inf in float32
    # and its gradient 0 * inf = NaN reached logprobs
    lp = torch.tensor([100.0, 0.1], requires_grad=True)
    out = ppo.policy_loss(lp, torch.zeros(2), torch.tensor([1.0, 1.0]))
    assert float(out.loss) == pytest.approx(-(1.2 + np.exp(0.1)) / 2, rel=1e-6)
    out.loss.backward()
    assert torch.isfinite(lp.grad).all() and float(lp.grad[0]) == 0.0
    assert float(out.clip_fraction) == 0.5


def test_a_masked_huge_ratio_never_reaches_the_loss():
    # old: a padding token with log-ratio 100: inf * 0 = NaN loss
    lp = torch.tensor([100.0, 0.0], requires_grad=True)
    out = ppo.policy_loss(lp, torch.zeros(2), torch.tensor([-1.0, 1.0]), mask=torch.tensor([False, True]))
    assert float(out.loss) == -1.0 and float(out.clip_fraction) == 0.0
    out.loss.backward()
    assert torch.isfinite(lp.grad).all()


def test_advantage_fit_of_huge_and_tiny_numbers():
    e3 = torch.tensor([1.0, 2.0, 3.0], dtype=F64)
    # old: estimate [1e308, -1e308, 3]: noise = nan
    fit = ppo.advantage_fit(torch.tensor([1e308, -1e308, 3.0], dtype=F64), e3, None, 3)
    assert np.isfinite(fit).all() and fit.kappa == pytest.approx(-5e307)
    # old: exact spread of 1e-300 squared to 0: "exact advantages have no spread"
    fit = ppo.advantage_fit(e3, torch.tensor([1e-300, -1e-300, 0.0], dtype=F64), None, 3)
    assert fit.kappa == pytest.approx(-5e299) and fit.offset == pytest.approx(2.0)
    # old: exact spread of 1e300 squared to inf: kappa = -0.0, noise 1.0 (all wrong)
    fit = ppo.advantage_fit(e3, torch.tensor([1e300, -1e300, 0.0], dtype=F64), None, 3)
    assert fit.kappa == pytest.approx(-5e-301) and fit.noise == pytest.approx(np.sqrt(0.75))
    with pytest.raises(ValueError, match=r"^estimate: the fit does not fit a float64"):
        ppo.advantage_fit(torch.tensor([1e308, -1e308, 0.0], dtype=F64),
                          torch.tensor([1e-300, -1e-300, 0.0], dtype=F64), None, 3)


# ---------------------------------------------------------------------------
# contracts broken quietly
# ---------------------------------------------------------------------------


def interval_on_rank(rank: int, world_size: int) -> "stats.Interval":
    """A torch.save-able result that is not a tensor (a frozen dataclass), for run_on_ranks."""
    return vl.mean_ci([float(rank), 1.0, 2.0 + world_size])


def test_run_on_ranks_loads_what_torch_save_wrote():
    # old: torch.load's default weights_only=True refused the Interval: UnpicklingError
    (got,) = distributed.run_on_ranks(interval_on_rank, 1)
    assert got == vl.mean_ci([0.0, 1.0, 3.0])


def test_shard_sizes_must_be_non_negative_row_counts():
    # old: sizes [5, -3] made a 2-row batch of which rank 0 "held" 5 rows: a global count below the local one
    with pytest.raises(ValueError, match=r"^sizes must be non-negative row counts"):
        distributed.shard_statistics(0, 2, [5, -3])
    with pytest.raises(ValueError, match=r"^sizes must be a list of 2 row counts"):
        distributed.shard_statistics(0, 2, [5])
    with pytest.raises(ValueError, match=r"^rank must lie in \[0, 1\]"):
        distributed.shard_statistics(2, 2, [5, 3])


@pytest.mark.parametrize("value, on", [("0", False), ("false", False), ("OFF", False), (" No ", False),
                                       ("1", True), ("True", True), ("yes", True), ("on", True), ("", True)])
def test_switch_spellings(monkeypatch, value, on):
    from valuelab._engine.checks import env_switch

    monkeypatch.setenv("VALUELAB_TEST_SWITCH", value)
    assert env_switch("VALUELAB_TEST_SWITCH", True) is on


def test_unknown_switch_value_is_not_ignored_silently(monkeypatch):
    from valuelab._engine.checks import env_switch

    monkeypatch.setenv("VALUELAB_TEST_SWITCH", "disable")
    with pytest.warns(UserWarning, match=r"VALUELAB_TEST_SWITCH='disable' is neither on .* nor off"):
        assert env_switch("VALUELAB_TEST_SWITCH", True) is True


def test_valuelab_native_off_in_any_spelling():
    # old: only the string "0" switched the kernel off; "off", "false", "no" were ignored without a word
    code = "from valuelab._engine import native as _native; print(_native.status())"
    for value in ("off", "FALSE"):
        proc = _run_isolated(code, env={"VALUELAB_NATIVE": value})
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == "C kernel switched off: PyTorch block scan", value
    proc = _run_isolated(code, env={"VALUELAB_NATIVE": "disable"})
    assert "VALUELAB_NATIVE='disable' is neither on" in proc.stderr


def _meta(*shape, dtype=torch.float32):
    return torch.ones(*shape, dtype=dtype, device="meta")


@pytest.mark.parametrize("call, name", [
    # old: NotImplementedError("Cannot copy out of meta tensor; no data!")
    (lambda: vl.mean_ci(_meta(3)), "x"),
    (lambda: vl.paired_ci(torch.ones(3), _meta(3)), "b"),
    # old: "target has no spread" (wrong) and RuntimeError for a meta mask
    (lambda: transformer.explained_variance(_meta(3), torch.ones(3), torch.ones(3, dtype=torch.bool)), "prediction"),
    (lambda: transformer.explained_variance(torch.ones(3), torch.ones(3), _meta(3, dtype=torch.bool)), "mask"),
    # old: NotImplementedError from float(d)
    (lambda: __import__("valuelab._engine.fastscan", fromlist=["x"]).fast_backward_scan(torch.ones(2, 5), _meta(())), "d"),
])
def test_meta_tensors_are_refused_by_name(call, name):
    with pytest.raises(ValueError, match=rf"^{name} is a meta tensor"):
        call()


def test_meta_policy_tables_are_refused_by_name():
    w = policy.make_prompt_world()
    shape = w.state_shape + (w.vocab_size,)
    probs = torch.full(shape, 1.0 / w.vocab_size, device="meta")
    # old: RuntimeError("Tensor.item() cannot be called on meta tensors")
    with pytest.raises(ValueError, match=r"^probs is a meta tensor"):
        policy.sample_responses(w, probs[None], 2, [0])
    # old: NotImplementedError
    with pytest.raises(ValueError, match=r"^probs is a meta tensor"):
        policy.evaluate_policy(w, probs)


def test_meta_state_indices_are_refused_by_name():
    w = world.make_world()
    # old: NotImplementedError from np.asarray of a meta tensor
    with pytest.raises(ValueError, match=r"^t is a meta tensor"):
        world.exact_q(w, torch.zeros(2, dtype=torch.long, device="meta"), 0, 0)
