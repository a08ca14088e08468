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
import numbers
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence, Tuple, Union

import numpy as np
import torch

from .._engine.checks import dense, real_number, shown

__all__ = ["Interval", "t_quantile", "mean_ci", "paired_ci", "equivalence", "Equivalence", "pm", "markdown_table"]

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


_PIECES = 4096  # Simpson's rule on 4096 pieces, with one Richardson step (the same nodes, every other one)
_DF_NORMAL = 10**18  # beyond it t(df) and the normal distribution agree to double precision
_TAIL = 1e-3  # upper tails below it are integrated directly, not as 1/2 minus the central part
_STEPS = 200  # bisection steps at most: far more than the ~110 that exhaust a float


def _simpson(f, a: float, b: float) -> float:
    """:math:`\\int_a^b f`: Simpson's rule on ``_PIECES`` pieces and on half as many, extrapolated (Boole's rule)."""
    n = _PIECES
    y = f(np.linspace(a, b, n + 1))
    w = np.ones(n + 1)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    wc = np.ones(n // 2 + 1)
    wc[1:-1:2], wc[2:-1:2] = 4.0, 2.0
    fine = (b - a) / (3 * n) * float(np.dot(w, y))
    coarse = (b - a) / (1.5 * n) * float(np.dot(wc, y[::2]))
    return fine + (fine - coarse) / 15


def _log_density_constant(df: float) -> float:
    """:math:`\\log c` of the density :math:`c\\,(1 + x^2/\\nu)^{-(\\nu+1)/2}`, :math:`c = \\Gamma(\\tfrac{\\nu+1}2) / (\\sqrt{\\nu\\pi}\\,\\Gamma(\\tfrac\\nu2))`.

    For :math:`\\nu/2 \\ge 32` from the asymptotic series of
    :math:`\\log\\Gamma(x + \\tfrac12) - \\log\\Gamma(x)` (error below 1e-16): the
    difference of two ``lgamma`` would lose ``log(df) * 1e-16`` of absolute
    precision, 1e-3 at ``df = 1e12``.
    """
    x = df / 2
    if x < 32:
        return math.lgamma(x + 0.5) - math.lgamma(x) - 0.5 * math.log(df * math.pi)
    ix = 1.0 / x  # lgamma(x + 1/2) - lgamma(x) = log(x)/2 - 1/(8x) + 1/(192x^3) - 1/(640x^5) + 17/(14336x^7) - ...
    return -0.5 * math.log(2 * math.pi) + ix * (-1 / 8 + ix * ix * (1 / 192 + ix * ix * (-1 / 640 + ix * ix * 17 / 14336)))


def _t_central(q: float, df: float, log_c: float) -> float:
    """P(0 <= X <= q) for X ~ t(df), by :func:`_simpson` after x = sqrt(df) tan(θ).

    The substitution turns the density into c sqrt(df) cos(θ)^(df-1) on
    [0, atan(q / sqrt(df))]: smooth and bounded, even for the Cauchy tail
    (df = 1); cos(θ)^(df-1) is taken as exp(-(df-1)/2 log1p(tan²θ)), exact
    for any df.
    """
    a = log_c + 0.5 * math.log(df)
    return _simpson(lambda th: np.exp(a - 0.5 * (df - 1) * np.log1p(np.tan(th) ** 2)), 0.0, math.atan(q / math.sqrt(df)))


def _t_tail(q: float, df: float, log_c: float) -> float:
    """P(X > q) for X ~ t(df) and q >= 3, integrated directly (1/2 minus the central part loses the tail to rounding).

    After x = q e^s the integrand c q e^s (1 + q² e^{2s}/df)^{-(df+1)/2}
    decays at least like e^{-0.44 s} (like e^{-df s} far out); it is
    integrated up to where the density has fallen by e^{-80}, a point in
    closed form, so nothing is left out that a double could hold.
    """
    u = q * q / df
    s_max = 0.5 * math.log(df * math.expm1(math.log1p(u) + 160.0 / (df + 1)) / (q * q))
    a = log_c + math.log(q)
    return _simpson(lambda s: np.exp(a + s - 0.5 * (df + 1) * np.log1p(u * np.exp(2 * s))), 0.0, s_max)


def t_quantile(p: float, df: int) -> float:
    """The ``p``-quantile of Student's t with ``df`` degrees of freedom, for ``0.5 <= p < 1`` (used by :func:`valuelab.lab.stats.mean_ci`).

    Solves :math:`P(X > q) = 1 - p` by bisection on at most 200 steps (a
    bound, not a tolerance: every step halves a finite bracket, and the loop
    ends when the bracket is one float wide). The bracket is
    :math:`[0, 1/(\\pi(1-p))]`: t(df)'s tail is at most the Cauchy tail
    :math:`\\arctan(1/q)/\\pi < 1/(\\pi q)`. The tail is numerical
    integration of the density (``_t_central`` above :math:`1 - p =
    10^{-3}`, ``_t_tail`` below), so every ``p < 1`` that a float holds
    has its quantile, up to :math:`1 - 2^{-53}` (about 6.7e7 at ``df = 2``);
    any ``df >= 1`` is taken (``df`` above 1e18 is the normal distribution
    to double precision). Accurate to about 1e-11 relative against
    ``scipy.stats.t.isf(1 - p, df)``.
    """
    if isinstance(df, (bool, np.bool_)) or not isinstance(df, numbers.Integral) or df < 1:
        raise ValueError(f"df must be an integer >= 1, got {shown(df)}")
    if isinstance(p, (bool, np.bool_)) or not (isinstance(p, (numbers.Integral, float, np.floating)) and 0.5 <= p < 1):
        raise ValueError(f"p must be in [0.5, 1), got {shown(p)}")
    return _t_quantile(float(p), int(df))  # checked first: the cache keys on exact floats and ints only


@lru_cache(maxsize=256)
def _t_quantile(p: float, df: int) -> float:
    """:func:`t_quantile` of a checked ``p`` (a float) and ``df`` (an int)."""
    if p == 0.5:
        return 0.0
    dff = float(min(df, _DF_NORMAL))
    log_c = _log_density_constant(dff)
    tail = 1.0 - p  # exact (Sterbenz): p is in [0.5, 1)
    hi = 1.0 / (math.pi * tail)
    if tail >= _TAIL:  # the central part is accurate to 1e-16 absolutely: enough for tails this wide
        lo, target = 0.0, p - 0.5
        for _ in range(_STEPS):
            mid = 0.5 * (lo + hi)
            if not lo < mid < hi:
                break
            if _t_central(mid, dff, log_c) < target:
                lo = mid
            else:
                hi = mid
        return 0.5 * (lo + hi)
    lo, hi = math.log(3.0), math.log(hi)  # t(df)'s 0.999-quantile is above the normal's, 3.09
    for _ in range(_STEPS):
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi:
            break
        if _t_tail(math.exp(mid), dff, log_c) > tail:
            lo = mid
        else:
            hi = mid
    return math.exp(0.5 * (lo + hi))


def _as_sample(x: object, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        if x.is_complex():
            raise TypeError(f"{name} must hold real numbers, got {x.dtype}")
        x = dense(x, name).detach().resolve_conj().resolve_neg().cpu().double().numpy()
    not_numbers = TypeError(f"{name} must be a 1-D sequence of real numbers (ints, floats, a numeric array), "
                            f"got {type(x).__name__:.40}")
    if isinstance(x, (str, bytes)):
        raise not_numbers
    if isinstance(x, (list, tuple)):  # 0-d tensors in a list: read without their graph (numpy refuses one that has it)
        x = [dense(v, f"{name}[{i}]").detach().cpu().resolve_conj().resolve_neg() if isinstance(v, torch.Tensor) else v
             for i, v in enumerate(x)]  # dense: a meta or freed tensor is refused by name, not copied out of
    try:
        raw = np.asarray(x)
        # a numeric dtype only: "0.5" is not 0.5 (numpy would parse it), a complex number is not real (numpy would
        # drop its imaginary part), and an object array (Fraction, Decimal, an int past int64) is not a sample
        if raw.dtype.kind not in "biuf":
            raise not_numbers
        a = raw.astype(np.float64)
    except (TypeError, ValueError, OverflowError, RuntimeError, NotImplementedError) as exc:
        raise not_numbers from exc
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one number per seed), got shape {a.shape}")
    if a.size < 2:
        raise ValueError(f"{name} needs at least 2 runs for an interval, got {a.size}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite; entry {int(np.argmin(np.isfinite(a)))} is {a[~np.isfinite(a)][0]}")
    return a


def _mean_sd(a: np.ndarray) -> Tuple[float, float]:
    """Mean and sample standard deviation (``ddof=1``) of ``a``, on the scale of its largest ``|entry|``.

    A power of two ``s`` with every ``|a / s| < 2`` (:func:`valuelab._engine.checks.scale_of`):
    the sums cannot overflow, so the mean of ``[1e308, 1e308]`` is 1e308,
    not inf; the standard deviation is inf only when the true one exceeds
    the largest float (the caller refuses it).
    """
    m = float(np.max(np.abs(a)))
    s = math.ldexp(1.0, math.frexp(m)[1] - 1) if m > 0 else 1.0
    b = a / s
    return s * float(b.mean()), s * float(b.std(ddof=1))


def _check_level(level: object) -> float:
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ValueError(f"level must be a number in (0, 1), got {shown(level)}")
    if 0.5 + level / 2 >= 1:  # the quantile's p rounds to 1: no finite interval
        raise ValueError(f"level must be a number in (0, 1) below 1 - 1.2e-16 (its t quantile is infinite), got {shown(level)}")
    return float(level)


def mean_ci(x: ArrayLike, level: float = 0.95) -> Interval:
    """The mean of ``x`` (one number per independent seed) with its Student-t interval.

    :math:`\\bar x \\pm t_{(1+\\text{level})/2,\\,n-1}\\, s/\\sqrt n`, with :math:`s` the
    sample standard deviation (``ddof=1``) of the :math:`n` runs.
    """
    return _interval(_as_sample(x, "x"), _check_level(level), "x")


def _interval(a: np.ndarray, level: float, name: str) -> Interval:
    """:func:`mean_ci` of the checked sample ``a``; an interval wider than the largest float is a ValueError naming ``name``."""
    n = a.size
    mean, sd = _mean_sd(a)
    half = t_quantile(0.5 + level / 2, n - 1) * (sd / math.sqrt(n))
    lo, hi = mean - half, mean + half
    if not (math.isfinite(half) and math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(
            f"{name}: the {level:g} interval of its mean overflows float64 (standard deviation {sd:.3g} over {n} runs): "
            "rescale the numbers"
        )
    return Interval(mean=mean, lo=lo, hi=hi, half=half, n=n, level=level)


def paired_ci(a: ArrayLike, b: ArrayLike, level: float = 0.95) -> Interval:
    """The mean of ``a - b`` over paired runs (entry i of both from seed i) with its t-interval (:func:`valuelab.lab.stats.mean_ci` of the differences).

    Raises ``ValueError`` when the two arms have different numbers of runs.
    """
    xa, xb = _as_sample(a, "a"), _as_sample(b, "b")
    if xa.size != xb.size:
        raise ValueError(f"a and b must pair up seed by seed: {xa.size} runs against {xb.size}")
    level = _check_level(level)
    with np.errstate(over="ignore"):
        d = xa - xb
    if not np.all(np.isfinite(d)):
        i = int(np.argmin(np.isfinite(d)))
        raise ValueError(f"a - b overflows float64 at entry {i} ({xa[i]:.3g} - {xb[i]:.3g}): rescale both arms")
    return _interval(d, level, "a - b")


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

    The mean of ``x`` (per-seed differences, as for :func:`valuelab.lab.stats.paired_ci`) is
    declared within ``margin`` of 0 when both one-sided t-tests reject, which
    is the same as the :math:`1 - 2\\alpha` interval
    :math:`\\bar x \\pm t_{1-\\alpha,\\,n-1}\\, s/\\sqrt n` lying inside
    :math:`(-m, m)`. Unlike "the 95% interval contains 0", more seeds can only
    make it easier to show equivalence, never harder. ``margin`` must be fixed
    before the run.
    """
    if (isinstance(margin, (bool, np.bool_)) or not isinstance(margin, (numbers.Integral, float, np.floating))
            or not math.isfinite(real_number(margin, "margin")) or margin <= 0):
        raise ValueError(f"margin must be a positive finite number, got {shown(margin)}")
    margin = float(margin)  # -np.uint64(m) wraps around to 2**64 - m: compare as a float
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 0.5:
        raise ValueError(f"alpha must be a number in (0, 0.5), got {shown(alpha)}")
    if 1 - 2 * alpha >= 1 or 0.5 + (1 - 2 * alpha) / 2 >= 1:
        raise ValueError(f"alpha must be a number in (0, 0.5) above 5.6e-17 (its t quantile is infinite), got {shown(alpha)}")
    ci = mean_ci(x, 1 - 2 * alpha)
    return Equivalence(interval=ci, margin=float(margin), equivalent=bool(-margin < ci.lo and ci.hi < margin))


def pm(ci: Interval, decimals: int = 2) -> str:
    """``"mean ± half"`` with ``decimals`` fixed decimals: how chapters 7, 8 and 10 glue an interval into prose.

    A mean that rounds to zero prints as ``0.00``, never ``-0.00``.
    """
    if not isinstance(ci, Interval):
        raise TypeError(f"ci must be an Interval (from mean_ci or paired_ci), got {type(ci).__name__}")
    if isinstance(decimals, (bool, np.bool_)) or not isinstance(decimals, numbers.Integral) or not 0 <= decimals <= 100:
        raise ValueError(f"decimals must be an integer in [0, 100], got {shown(decimals)}")
    decimals = int(decimals)
    return f"{round(ci.mean, decimals) + 0.0:.{decimals}f} ± {ci.half:.{decimals}f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown (GFM/MyST) table: how chapters show a result as an HTML table, glued with ``{glue:md}`` (issue 26).

    ``header``: the column titles, a non-empty sequence of strings. ``rows``:
    a sequence of rows, each with one cell per column; a cell is a string or
    a number (``str()`` of it: round numbers before, e.g. with :func:`pm`).
    A ``|`` inside a cell is escaped; a line break in a cell, a row of the
    wrong length or a cell of another type is a ValueError or TypeError
    naming ``header`` or ``rows``.
    """
    if isinstance(header, (str, bytes)) or not isinstance(header, Sequence):
        raise TypeError(f"header must be a sequence of strings, got {type(header).__name__}")
    if not len(header):
        raise ValueError("header must name at least one column")
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence):
        raise TypeError(f"rows must be a sequence of rows, got {type(rows).__name__}")

    def cell(x: object, where: str) -> str:
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (str, numbers.Real)):
            raise TypeError(f"{where} must be a string or a real number, got {type(x).__name__}")
        text = x if isinstance(x, str) else str(x)
        if "\n" in text or "\r" in text:
            raise ValueError(f"{where} holds a line break: a table cell is one line")
        return text.replace("|", "\\|")

    for j, h in enumerate(header):
        if not isinstance(h, str):
            raise TypeError(f"header[{j}] must be a string, got {type(h).__name__}")
    head = [cell(h, f"header[{j}]") for j, h in enumerate(header)]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for i, row in enumerate(rows):
        if isinstance(row, (str, bytes)) or not isinstance(row, Sequence):
            raise TypeError(f"rows[{i}] must be a sequence of cells, got {type(row).__name__}")
        if len(row) != len(head):
            raise ValueError(f"rows[{i}] has {len(row)} cells, header has {len(head)} columns")
        lines.append("| " + " | ".join(cell(x, f"rows[{i}][{j}]") for j, x in enumerate(row)) + " |")
    return "\n".join(lines)
