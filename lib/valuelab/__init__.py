"""valuelab: the targets and losses that train the value model (critic) of PPO on language models.

Every function names the equation it implements and the chapter of the book
that derives it. The package has three parts, one per reader.

**The estimators** (this folder: what a trainer imports). Everything public
is exported here (``vl.gae``, ``vl.value_loss``, ...):

================================  ================================================  ==========
module                            what                                              chapter
================================  ================================================  ==========
``returns``                       Monte-Carlo return, TD(0) target, n-step return   1, 2, 4
``advantages``                    TD error, GAE, the λ-return, decoupled GAE,       4, 5, 10
                                  length-adaptive λ
``rewards``                       per-token KL penalty (k1, k2, k3) + score on EOS  3
``losses``                        value loss (plain, PPO-clipped), masked           6
                                  mean/var/whiten, explained variance
``packed``                        GAE and returns on packed sequences (cu_seqlens)  11
``distributed``                   statistics across gloo ranks, ``run_on_ranks``    14
``runtime``                       device choice (cuda, else cpu), seeding, style    all
``integrations.verl``             verl's GAE, in one process or every Ray worker    14
``integrations.openrlhf``         OpenRLHF's GAE, in one process or every worker    14
``integrations.torchrl``          TorchRL's functional GAE, its exact semantics     14
``integrations.trl``              TRL's PPO tensors in valuelab's layout and back   14
``integrations.peers``            the trainers' own sources, read for the tests     14
``integrations._conventions``     the two conventions for holes                     14
``integrations._swap``            installing a drop-in, and its refusals            14
``__main__``                      ``python -m valuelab info``                       9
``bench``                         ``python -m valuelab.bench``: the entry point     9
                                  kept where it was; runs ``lab.bench``
================================  ================================================  ==========

**The laboratory** (``valuelab.lab``: the book's apparatus, for its readers;
a trainer needs none of it):

================================  ================================================  ==========
``lab.world``                     a toy token-level world with exact values (DP)    7
``lab.critic``                    tabular and tiny GRU critics, refresh-then-fit    7
``lab.pretrain``                  value pretraining (critic warm-up)                10
``lab.policy``                    a many-prompt world, a learnable policy, the      12
                                  soft optimum solved exactly
``lab.ppo``                       PPO with the critic's target as the variable      12
``lab.transformer``               a tiny causal transformer as reward model and     13
                                  critic, many seeds in one pass
``lab.lm``                        SmolLM2-135M-Instruct from its PyPI package,      15
                                  Monte-Carlo values, a ridge value head
``lab.stats``                     confidence intervals over seeds, equivalence      7-15
                                  tests, the tables of the chapters
``lab.symbolic``                  SymPy constructors of the same quantities         4, 5
``lab.reference``                 literal numpy transcriptions: the tests' oracle   all
``lab.bench``                     the GAE benchmark and its stored runs             9
================================  ================================================  ==========

**The engine** (``valuelab._engine``: what a call runs through; private, for
its maintainers):

================================  ================================================  ==========
``_engine.checks``                argument validation: every error names its        all
                                  argument
``_engine.problem``               the front door: validate once into a              9
                                  ``Problem``, dispatch to one backend (C kernel,
                                  PyTorch blocked scan, general path)
``_engine.native``                the C kernel ``_gae_kernel.c``, built at          9
                                  install, loaded through ctypes
``_engine.blocked``               the PyTorch path of the fused estimators          9
``_engine.scan``                  the general path: hole compaction, the loop       9
``_engine.fastscan``              the loop-free scan's entry point                  9
``_engine.toeplitz``              constant decay: the blocked Toeplitz form         9
``_engine.doubling``              per-step decay: blocked doubling of affine maps   9
``_engine.nstep``                 the n-step return by sparse-table doubling        9
``_engine.masks``                 masks without argsort: right padding, compaction  9
``_engine.workspace``             reused scratch buffers of the PyTorch path        9
``_engine.dist``                  sums across data-parallel ranks                   6
``_engine.docs``                  docstring text the estimators share               all
================================  ================================================  ==========

The import rules (checked on the import graph by ``tests/test_layout.py``):
the estimators never import ``valuelab.lab``; the laboratory imports the
estimators; the engine imports neither. ``import valuelab`` does not load the
laboratory: ``vl.lab``, and the names that lived here before the laboratory
had its folder (``vl.stats``, ``vl.mean_ci``, ``vl.paired_ci``,
``vl.Interval``), load it when first read.

Conventions (notation page of the book): tensors are ``(T,)`` or ``(B, T)``;
``values[..., t]`` is :math:`V(s_t)`, the value of the state before token
:math:`t`; after the last valid token the next value is ``bootstrap``
(default 0: EOS ends the episode); masked tokens (padding or holes) are
skipped and get 0 in every output.
"""

from __future__ import annotations

import importlib
from typing import Any

from .advantages import DecoupledGAE, GAEResult, decoupled_gae, gae, length_adaptive_lam, td_errors
from .losses import masked_mean, masked_whiten, value_loss, value_loss_stats
from .returns import discounted_returns, nstep_returns, td_targets
from .rewards import kl_penalty, kl_shaped_rewards, last_token_onehot
from .runtime import BOOK_STYLE, pick_device, seed_everything

__version__ = "0.1.0"

__all__ = [
    "discounted_returns",
    "td_targets",
    "nstep_returns",
    "td_errors",
    "gae",
    "GAEResult",
    "decoupled_gae",
    "DecoupledGAE",
    "length_adaptive_lam",
    "kl_penalty",
    "kl_shaped_rewards",
    "last_token_onehot",
    "masked_mean",
    "masked_whiten",
    "value_loss",
    "value_loss_stats",
    "pick_device",
    "seed_everything",
    "BOOK_STYLE",
]

# Read on first use, so that ``import valuelab`` loads no laboratory module (the import rules above).
_LAZY = {"lab": ("valuelab.lab", None), "stats": ("valuelab.lab.stats", None),
         "Interval": ("valuelab.lab.stats", "Interval"), "mean_ci": ("valuelab.lab.stats", "mean_ci"),
         "paired_ci": ("valuelab.lab.stats", "paired_ci")}


def __getattr__(name: str) -> Any:
    """``vl.lab`` and the laboratory's names kept here for earlier code: imported when first read (PEP 562)."""
    if name not in _LAZY:
        raise AttributeError(f"module 'valuelab' has no attribute {name!r}")
    module, attr = _LAZY[name]
    found = importlib.import_module(module)
    return found if attr is None else getattr(found, attr)


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY))
