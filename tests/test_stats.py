"""valuelab.lab.stats: the t quantile against SciPy, the intervals against their definition, bad input named."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import valuelab as vl
from valuelab import lab
from valuelab.lab.stats import t_quantile

scipy_stats = pytest.importorskip("scipy.stats")


@pytest.mark.parametrize("df", [1, 2, 3, 5, 7, 9, 19, 30, 99])
@pytest.mark.parametrize("p", [0.5, 0.8, 0.9, 0.95, 0.975, 0.995, 0.9995])
def test_t_quantile_matches_scipy(p, df):
    assert t_quantile(p, df) == pytest.approx(scipy_stats.t.ppf(p, df), rel=1e-7, abs=1e-9)


def test_mean_ci_is_the_t_interval():
    rng = np.random.default_rng(0)
    x = rng.normal(1.0, 2.0, size=12)
    ci = vl.mean_ci(x, level=0.9)
    half = scipy_stats.t.ppf(0.95, 11) * x.std(ddof=1) / math.sqrt(12)
    assert ci.mean == pytest.approx(x.mean())
    assert ci.half == pytest.approx(half, rel=1e-7)
    assert (ci.lo, ci.hi) == pytest.approx((x.mean() - half, x.mean() + half), rel=1e-7)
    assert ci.n == 12 and ci.level == 0.9
    assert ci.fmt(2) == f"{x.mean():.2g} ± {half:.2g}"


def test_coverage_over_many_experiments():
    """About 95% of 95% intervals from n = 8 normal samples cover the true mean (binomial margin)."""
    rng = np.random.default_rng(1)
    cover = []
    for _ in range(2000):
        ci = vl.mean_ci(rng.normal(3.0, 1.0, size=8))
        cover.append(ci.lo <= 3.0 <= ci.hi)
    assert abs(np.mean(cover) - 0.95) < 0.015


def test_paired_ci_is_the_interval_of_differences():
    a = torch.tensor([1.0, 2.0, 3.5, 4.0, 2.2], dtype=torch.float64)
    b = a - torch.tensor([0.1, 0.3, 0.2, 0.25, 0.15], dtype=torch.float64)
    ci = vl.paired_ci(a, b)
    ref = vl.mean_ci((a - b).numpy())
    assert ci == ref
    assert ci.excludes_zero() and ci.lo > 0


@pytest.mark.parametrize("bad,match", [([1.0], "at least 2"), ([[1.0, 2.0]], "1-D"), ([1.0, float("nan")], "finite"),
                                       ("ab", "1-D|numbers")])
def test_bad_samples_are_named(bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        vl.mean_ci(bad)


def test_bad_level_and_pairs():
    with pytest.raises(ValueError, match="level"):
        vl.mean_ci([1.0, 2.0], level=1.0)
    with pytest.raises(ValueError, match="pair up"):
        vl.paired_ci([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="df"):
        t_quantile(0.9, 0)
    with pytest.raises(ValueError, match="p must"):
        t_quantile(0.2, 3)


def test_pm_fixed_decimals_and_bad_input():
    ci = vl.mean_ci([1.0, 2.0, 3.0, 4.0])
    assert lab.stats.pm(ci, 3) == f"{ci.mean:.3f} ± {ci.half:.3f}"
    assert lab.stats.pm(ci) == f"{ci.mean:.2f} ± {ci.half:.2f}"
    with pytest.raises(TypeError, match="ci must"):
        lab.stats.pm((1.0, 0.1))
    with pytest.raises(ValueError, match="decimals"):
        lab.stats.pm(ci, -1)


def test_pm_never_prints_negative_zero():
    ci = vl.mean_ci([-0.0001, 0.0, 0.00005])
    assert lab.stats.pm(ci, 2).startswith("0.00 ± ")


def test_equivalence_is_scipys_two_one_sided_tests():
    """TOST: equivalent iff both one-sided t-tests reject at alpha, i.e. the 1 - 2 alpha interval is inside the margin."""
    scipy_stats = pytest.importorskip("scipy.stats")
    from valuelab.lab.stats import equivalence

    rng = np.random.default_rng(3)
    agree = 0
    for trial in range(300):
        x = rng.normal(rng.uniform(-0.004, 0.004), 0.003, size=int(rng.integers(5, 40)))
        margin = 0.003
        p_low = scipy_stats.ttest_1samp(x, -margin, alternative="greater").pvalue
        p_high = scipy_stats.ttest_1samp(x, margin, alternative="less").pvalue
        e = equivalence(x, margin)
        assert e.equivalent == (p_low < 0.05 and p_high < 0.05)
        assert e.interval.level == pytest.approx(0.9)
        agree += e.equivalent
    assert 20 < agree < 280  # both verdicts occur: the check is not vacuous


def test_equivalence_is_not_the_95_interval_containing_zero():
    """The nearest wrong rule, 'the 95% interval contains 0', rewards few seeds; TOST does not."""
    from valuelab.lab.stats import equivalence

    few = np.array([0.004, -0.003, 0.005])  # wide interval: contains 0, yet nothing is shown
    assert vl.mean_ci(few).lo < 0 < vl.mean_ci(few).hi and not equivalence(few, 0.003).equivalent
    many = np.full(40, 0.0012) + np.linspace(-1e-4, 1e-4, 40)  # excludes 0, yet within the margin
    assert vl.mean_ci(many).excludes_zero() and equivalence(many, 0.003).equivalent
    with pytest.raises(ValueError, match="margin"):
        equivalence(many, 0.0)
    with pytest.raises(ValueError, match="alpha"):
        equivalence(many, 0.003, alpha=0.5)


def test_markdown_table_exact_text_and_refusals():
    from valuelab.lab.stats import markdown_table

    assert markdown_table(("arm", "gap"), [["a|b", 0.5], ("c", 3)]) == (
        "| arm | gap |\n|---|---|\n| a\\|b | 0.5 |\n| c | 3 |")
    assert markdown_table(["x"], []) == "| x |\n|---|"
    for header, rows, err, name in [("ab", [], TypeError, "header"), ([], [], ValueError, "header"),
                                    ([1], [], TypeError, r"header\[0\]"), (["a"], "r", TypeError, "rows"),
                                    (["a"], [[1, 2]], ValueError, r"rows\[0\]"), (["a"], [[True]], TypeError, r"rows\[0\]\[0\]"),
                                    (["a"], [["x\ny"]], ValueError, r"rows\[0\]\[0\]"), (["a"], ["xy"], TypeError, r"rows\[0\]")]:
        with pytest.raises(err, match=rf"^{name}"):
            markdown_table(header, rows)
