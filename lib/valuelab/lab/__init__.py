"""The book's laboratory: worlds with exact values, the critics, PPO, the transformer, the statistics, SymPy.

For the reader of the book, who re-runs a chapter's experiment or extends it:
the chapters import it as ``from valuelab import lab`` (``lab.stats.pm``) or
``from valuelab.lab.world import make_world``. A trainer needs none of it;
the estimators it trains with are ``valuelab``'s top level.

What it may import: the estimators (``valuelab.returns``, ``.advantages``,
``.losses``, ...) and the engine's checks. What must not import it: the
estimators and the engine (``tests/test_layout.py`` checks both on the import
graph). Its modules load when first read, so ``from valuelab import lab``
costs nothing until ``lab.world`` (or another) is used.

The map of its modules, with the chapter each serves, is in the package
docstring (``help(valuelab)``).
"""

from __future__ import annotations

import importlib
from types import ModuleType

MODULES = ("world", "critic", "pretrain", "policy", "ppo", "transformer", "lm", "stats", "symbolic", "reference", "bench")

__all__ = list(MODULES)


def __getattr__(name: str) -> ModuleType:
    """``lab.world`` and the others: each imported when first read (PEP 562)."""
    if name not in MODULES:
        raise AttributeError(f"module 'valuelab.lab' has no attribute {name!r}")
    return importlib.import_module(f"{__name__}.{name}")


def __dir__() -> list:
    return sorted(set(globals()) | set(MODULES))
