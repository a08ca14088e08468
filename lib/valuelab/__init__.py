"""valuelab: targets for training the value model (critic) of PPO on language models.

Every function names the equation it implements and the chapter of the book
that derives it. The package is cut by concept, one hop from formula to code:

=====================  =====================================================  ==========
module                 what                                                   chapter
=====================  =====================================================  ==========
``returns``            Monte-Carlo return, TD(0) target, n-step return        1, 2, 4
``advantages``         TD error, GAE, the λ-return, decoupled GAE,            4, 5, 10
                       length-adaptive λ
``rewards``            per-token KL penalty (k1, k2, k3) + score on EOS       3
``losses``             value loss (plain, PPO-clipped), masked mean/whiten    6
``reference``          literal numpy transcriptions: the tests' oracle        all
``symbolic``           SymPy constructors of the same quantities              4, 5
``world``              a toy token-level world with exact values (DP)         7
``critic``             tabular and tiny GRU critics, refresh-then-fit loop    7
``pretrain``           value pretraining (critic warm-up)                     10
``runtime``            device choice (cuda, else cpu) and seeding             all
``stats``              confidence intervals over seeds (mean, paired)         7, 8, 10
``bench``              the GAE benchmark (``python -m valuelab.bench``)       9
``lm``                 SmolLM2-135M-Instruct read offline from its PyPI       (next)
                       package; the response slice; Monte-Carlo values
=====================  =====================================================  ==========

How a call runs (internal modules, one per step or algorithm; chapter 9):

=====================  =====================================================
``_checks``            argument validation: every error names its argument
``_problem``           the front door: validate once into a ``Problem``, then
                       dispatch to one backend (C kernel, PyTorch blocked
                       scan, or the general differentiable path)
``_native``            the C kernel ``_gae_kernel.c``, built at install
``_blocked``           the PyTorch path of the fused estimators
``_scan``              the general path: hole compaction, the per-token loop
``_fastscan``          the loop-free scan's entry point (chooses the form)
``_toeplitz``          constant decay: the blocked Toeplitz form
``_doubling``          per-step decay: blocked doubling of affine maps
``_nstep``             the n-step return by sparse-table doubling
``_masks``             masks without argsort: right-padding test, compaction
``_workspace``         reused scratch buffers of the PyTorch path
=====================  =====================================================

Conventions (notation page of the book): tensors are ``(T,)`` or ``(B, T)``;
``values[..., t]`` is :math:`V(s_t)`, the value of the state before token
:math:`t`; after the last valid token the next value is ``bootstrap``
(default 0: EOS ends the episode); masked tokens (padding or holes) are
skipped and get 0 in every output.
"""

from .advantages import DecoupledGAE, GAEResult, decoupled_gae, gae, length_adaptive_lam, td_errors
from .losses import masked_mean, masked_whiten, value_loss, value_loss_stats
from .returns import discounted_returns, nstep_returns, td_targets
from .rewards import kl_penalty, kl_shaped_rewards, last_token_onehot
from .runtime import BOOK_STYLE, pick_device, seed_everything
from .stats import Interval, mean_ci, paired_ci

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
    "Interval",
    "mean_ci",
    "paired_ci",
]
