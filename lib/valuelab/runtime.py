"""Device choice and seeding, shared by every chapter (see CONTRIBUTING.md)."""

from __future__ import annotations

import os
import random
from types import MappingProxyType

import numpy as np
import torch

from ._engine.checks import check_seed

__all__ = ["BOOK_STYLE", "pick_device", "seed_everything"]

BOOK_STYLE = MappingProxyType({
    "figure.dpi": 100, "savefig.dpi": 100, "figure.figsize": (6.8, 3.4),
    "font.size": 10, "axes.titlesize": 10, "axes.labelsize": 10,
    "legend.fontsize": 9, "xtick.labelsize": 9, "ytick.labelsize": 9, "legend.framealpha": 0.85,
})
"""Matplotlib settings of every figure of the book: ``plt.rcParams.update(vl.BOOK_STYLE)`` (read-only).

A figure 6.8 inches wide at 100 dpi is 680 pixels, the width of the book's
text column at 1280 px, so it is shown at full size and a 9-point label
stays 9 points on the page (tests/test_browser.py checks the scale); a
two-panel row is drawn within that width, or its panels are stacked.
"""


def pick_device() -> torch.device:
    """``cuda`` when a GPU is present, else ``cpu``: the one code path of every chapter."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, numpy and torch (CPU and CUDA); return a CPU ``torch.Generator`` seeded the same.

    ``seed`` is an int in ``[0, 2**63 - 1]``, the range every seed argument of
    valuelab takes (``valuelab._engine.checks.check_seed``): TypeError or
    ValueError naming ``seed`` otherwise. numpy's legacy global generator
    takes ``seed % 2**32``.
    """
    seed = check_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return torch.Generator().manual_seed(seed)
