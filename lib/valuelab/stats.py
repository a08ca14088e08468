r"""Confidence intervals for the experiments: a mean over seeds, and a paired difference of two arms.

The rule of the book (CONTRIBUTING.md, "Experiments"): an effect stated in
the prose comes from enough independent seeds to carry a confidence
interval, and the notebook asserts it with a margin. These helpers give the
interval every experiment chapter (7, 8, 10 and later) quotes:

.. math::
   :label: eq-stats-t-interval

   \bar x \pm t_{1-\alpha/2,\,n-1}\,\frac{s}{\sqrt n},
   \qquad s^2 = \frac{1}{n-1}\sum_{i=1}^n (x_i-\bar x)^2,

the Student-t interval for the mean of ``n`` independent runs (one per
seed). For two arms run on the *same* seeds, the paired interval is the
t-interval of the per-seed differences: the seed's shared noise cancels,
which is why chapter 8 compares arms seed by seed.

The t quantile is computed here (numerical inversion of the t distribution
function), so valuelab needs no SciPy; ``tests/test_stats.py`` checks it
against ``scipy.stats.t.ppf``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence, Union

import numpy as np
import torch

__all__ = ["Interval", "t_quantile", "mean_ci", "paired_ci", "equivalence", "Equivalence", "pm"]

ArrayLike = Union[Sequence[float], np.ndarray, torch.Tensor]


@dataclass(frozen=True)
class Interval:
    """A mean with its two-sided confidence interval ``[lo, hi]`` (``half`` = half-width) over ``n`` runs."""

    mean: float
    lo: float
    hi: float
    half: float
    n: int
    level: float

    def excludes_zero(self) -> bool:
        """True when the whole interval lies on one side of 0 (the effect's sign is resolved at this level)."""
        return self.lo > 0 or self.hi < 0

    def fmt(self, digits: int = 3) -> str:
        """``"mean ± half"`` rounded to ``digits`` significant decimals, for prose (via glue)."""
        return f"{self.mean:.{digits}g} ± {self.half:.{digits}g}"


def _t_cdf_upper_half(q: float, df: int, pieces: int = 2048) -> float:
    """P(0 <= X <= q) for X ~ t(df), by Simpson's rule after x = sqrt(df) tan(θ).

    The substitution turns the density into c sqrt(df) cos(θ)^(df-1) on
    [0, atan(q / sqrt(df))]: smooth and bounded, even for the Cauchy tail (df = 1).
    """
    end = math.atan(q / math.sqrt(df))
    theta = np.linspace(0.0, end, pieces + 1)
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(math.pi)
    f = np.exp(log_c) * np.cos(theta) ** (df - 1)
    w = np.ones(pieces + 1)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return float(end / (3 * pieces) * np.dot(w, f))


@lru_cache(maxsize=256)
def t_quantile(p: float, df: int) -> float:
    """The ``p``-quantile of Student's t with ``df`` degrees of freedom, for ``0.5 <= p < 1`` (used by :func:`valuelab.mean_ci`).

    Solves ``1/2 + P(0 <= X <= q) = p`` by bisection to 1e-10; accurate to
    about 1e-8 against ``scipy.stats.t.ppf`` for ``df >= 1`` and
    ``p <= 0.9995``.
    """
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"df must be an integer >= 1, got {df!r}")
    if not (isinstance(p, (int, float)) and 0.5 <= p < 1):
        raise ValueError(f"p must be in [0.5, 1), got {p!r}")
    target = p - 0.5
    lo, hi = 0.0, 1.0
    while _t_cdf_upper_half(hi, df) < target:  # bracket: heavy tails at df = 1 need a wide one
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-10 * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        if _t_cdf_upper_half(mid, df) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _as_sample(x: object, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().double().numpy()
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a 1-D sequence of numbers, got {type(x).__name__}") from exc
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one number per seed), got shape {a.shape}")
    if a.size < 2:
        raise ValueError(f"{name} needs at least 2 runs for an interval, got {a.size}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite; entry {int(np.argmin(np.isfinite(a)))} is {a[~np.isfinite(a)][0]}")
    return a


def _check_level(level: object) -> float:
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ValueError(f"level must be a number in (0, 1), got {level!r}")
    return float(level)


def mean_ci(x: ArrayLike, level: float = 0.95) -> Interval:
    """The mean of ``x`` (one number per independent seed) with its Student-t interval.

    :math:`\\bar x \\pm t_{(1+\\text{level})/2,\\,n-1}\\, s/\\sqrt n`, with :math:`s` the
    sample standard deviation (``ddof=1``) of the :math:`n` runs.
    """
    a = _as_sample(x, "x")
    level = _check_level(level)
    n = a.size
    mean = float(a.mean())
    half = t_quantile(0.5 + level / 2, n - 1) * float(a.std(ddof=1)) / math.sqrt(n)
    return Interval(mean=mean, lo=mean - half, hi=mean + half, half=half, n=n, level=level)


def paired_ci(a: ArrayLike, b: ArrayLike, level: float = 0.95) -> Interval:
    """The mean of ``a - b`` over paired runs (entry i of both from seed i) with its t-interval (:func:`valuelab.mean_ci` of the differences).

    Raises ``ValueError`` when the two arms have different numbers of runs.
    """
    xa, xb = _as_sample(a, "a"), _as_sample(b, "b")
    if xa.size != xb.size:
        raise ValueError(f"a and b must pair up seed by seed: {xa.size} runs against {xb.size}")
    return mean_ci(xa - xb, level)


@dataclass(frozen=True)
class Equivalence:
    """Output of :func:`equivalence`: the interval the two one-sided tests read, the margin, and the verdict."""

    interval: Interval
    """The :math:`1 - 2\\alpha` t-interval of the mean (90% for :math:`\\alpha = 0.05`)."""
    margin: float
    equivalent: bool
    """True when the whole interval lies inside ``(-margin, margin)``."""


def equivalence(x: ArrayLike, margin: float, alpha: float = 0.05) -> Equivalence:
    """Two one-sided tests (TOST) of ``|mean| < margin`` at level ``alpha``, for a null claim ("no practical difference").

    The mean of ``x`` (per-seed differences, as for :func:`valuelab.paired_ci`) is
    declared within ``margin`` of 0 when both one-sided t-tests reject, which
    is the same as the :math:`1 - 2\\alpha` interval
    :math:`\\bar x \\pm t_{1-\\alpha,\\,n-1}\\, s/\\sqrt n` lying inside
    :math:`(-m, m)`. Unlike "the 95% interval contains 0", more seeds can only
    make it easier to show equivalence, never harder. ``margin`` must be fixed
    before the run.
    """
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin) or margin <= 0:
        raise ValueError(f"margin must be a positive finite number, got {margin!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 0.5:
        raise ValueError(f"alpha must be a number in (0, 0.5), got {alpha!r}")
    ci = mean_ci(x, 1 - 2 * alpha)
    return Equivalence(interval=ci, margin=float(margin), equivalent=bool(-margin < ci.lo and ci.hi < margin))


def pm(ci: Interval, decimals: int = 2) -> str:
    """``"mean ± half"`` with ``decimals`` fixed decimals: how chapters 7, 8 and 10 glue an interval into prose.

    A mean that rounds to zero prints as ``0.00``, never ``-0.00``.
    """
    if not isinstance(ci, Interval):
        raise TypeError(f"ci must be an Interval (from mean_ci or paired_ci), got {type(ci).__name__}")
    if isinstance(decimals, bool) or not isinstance(decimals, int) or decimals < 0:
        raise ValueError(f"decimals must be an integer >= 0, got {decimals!r}")
    return f"{round(ci.mean, decimals) + 0.0:.{decimals}f} ± {ci.half:.{decimals}f}"
