"""A tiny causal transformer as reward model and as critic, many seeds in one pass (chapter 13 (:doc:`/chapters/13_transformer_critic`)).

A production critic is a causal transformer with a linear value head on its
last hidden states, started from the reward model. This module builds the
smallest such model that still has to *infer* the world's state: it reads
the prompt and the response tokens, nothing else (no position count or GOOD
count handed to it, unlike :class:`valuelab.lab.critic.TinyCritic`).

**The sequence.** For prompt ``p`` and response :math:`a_0 \\dots a_{n-1}` the
model reads :math:`x = (\\langle p\\rangle, a_0, \\dots, a_{n-1})`: position 0
holds the prompt token (id ``vocab_size + p``), position :math:`j \\ge 1` holds
:math:`a_{j-1}`. Causal attention lets position :math:`j` see
:math:`x_0..x_j` only.

**The alignment** (equation :eq:`eq-critic-alignment`). The state before
token :math:`t` is :math:`s_t = (p, a_0..a_{t-1})`, and the last position that
has read exactly that is :math:`j = t`. So

* the critic's :math:`V(s_t)` is the head at position :math:`t`
  (:func:`state_values`), for :math:`t = 0..T-1`: the prompt position for
  :math:`t = 0`. Reading position :math:`t + 1` instead (the one that holds
  :math:`a_t`) gives a "value" that has already seen the action it is meant
  to judge. Trainers take the aligned slice as ``values[:, -L-1:-1]``; where
  the shift belongs is a recurring question (verl issues 847 and 1960);
* the reward model's score of a finished response is the head at position
  :math:`n`, the one that has read the last token (:func:`final_scores`).

A critic started from the reward model (:func:`reward_model_start`) reuses
every weight, head included, as TRL, OpenRLHF and DeepSpeed-Chat do; its
:math:`V_0(s_t)` is then the reward model's score of the prefix
:math:`a_0..a_{t-1}` read as if it were a whole response.

**Many seeds at once.** :class:`TinyTransformer` holds ``n_models``
independent transformers (every weight has a leading model axis) and runs
them with batched matrix products, so eight seeds cost about one larger
batch. Model ``r`` reads only its own inputs ``inputs[r]``; no computation
mixes models, so each one's result is what it would be alone.
"""

from __future__ import annotations

import copy
from typing import Optional, Sequence

import torch
from torch import nn

from .._engine.checks import check_dim, check_index_range, check_int, check_memory, check_positive_int, check_seed, dense, require_finite, require_finite_result
from ..losses import _explained_variance
from .policy import PromptBatch, PromptWorld

__all__ = [
    "TinyTransformer",
    "sequence_inputs",
    "state_values",
    "final_scores",
    "reward_model_start",
    "tile",
    "select",
    "explained_variance",
]


class TinyTransformer(nn.Module):
    """``n_models`` independent pre-norm causal transformers with a scalar head (chapter 13 (:doc:`/chapters/13_transformer_critic`)).

    Each model: token and learned position embeddings of width ``d_model``,
    ``n_layers`` blocks of causal multi-head self-attention and a GELU
    feed-forward layer (each behind a LayerNorm, with a residual), a final
    LayerNorm and a linear head :math:`w^\\top h_j + b`. Weights start as in
    GPT-2 (normal, standard deviation 0.02; zero biases).

    Args:
        n_models: independent models R (one per seed and configuration).
        n_tokens: size of the input vocabulary (response tokens and prompt tokens).
        max_positions: longest sequence the position table covers.
        d_model, n_layers, n_heads, d_ff: sizes; ``n_heads`` must divide ``d_model``.
        seed: seeds the initial weights without touching the global RNG
            (None: the global RNG). The R models get different weights
            from the one draw. An int in ``[0, 2**63 - 1]``, as every seed
            of valuelab.
    """

    def __init__(
        self,
        n_models: int,
        n_tokens: int,
        max_positions: int,
        *,
        d_model: int = 32,
        n_layers: int = 2,
        n_heads: int = 2,
        d_ff: int = 64,
        seed: Optional[int] = None,
    ) -> None:
        super().__init__()
        self.n_models = check_positive_int(n_models, "n_models")
        self.n_tokens = check_positive_int(n_tokens, "n_tokens")
        self.max_positions = check_positive_int(max_positions, "max_positions")
        self.d_model = check_positive_int(d_model, "d_model")
        self.n_layers = check_positive_int(n_layers, "n_layers")
        self.n_heads = check_positive_int(n_heads, "n_heads")
        self.d_ff = check_positive_int(d_ff, "d_ff")
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads must divide d_model, got d_model={d_model}, n_heads={n_heads}")
        seed = check_seed(seed, none_ok=True)
        R, D, F, Lyr = self.n_models, self.d_model, self.d_ff, self.n_layers
        sizes = {"n_models": R, "n_tokens": self.n_tokens, "max_positions": self.max_positions, "d_model": D,
                 "n_layers": Lyr, "d_ff": F}
        per_layer = 4 * D + 4 * D * D + 4 * D + 2 * D + 2 * D * F + F + D
        n_params = R * ((self.n_tokens + self.max_positions) * D + Lyr * per_layer + 3 * D + 1)
        check_memory(4 * n_params, max(sizes, key=sizes.get))  # float32 weights; names the largest size
        gen = torch.Generator().manual_seed(seed) if seed is not None else None

        def normal(*shape: int) -> nn.Parameter:
            return nn.Parameter(0.02 * torch.randn(*shape, generator=gen))

        def const(value: float, *shape: int) -> nn.Parameter:
            return nn.Parameter(torch.full(shape, float(value)))

        self.tok = normal(R, self.n_tokens, D)
        self.pos = normal(R, self.max_positions, D)
        self.ln1_w, self.ln1_b = const(1, Lyr, R, D), const(0, Lyr, R, D)
        self.qkv_w, self.qkv_b = normal(Lyr, R, D, 3 * D), const(0, Lyr, R, 3 * D)
        self.out_w, self.out_b = normal(Lyr, R, D, D), const(0, Lyr, R, D)
        self.ln2_w, self.ln2_b = const(1, Lyr, R, D), const(0, Lyr, R, D)
        self.ff1_w, self.ff1_b = normal(Lyr, R, D, F), const(0, Lyr, R, F)
        self.ff2_w, self.ff2_b = normal(Lyr, R, F, D), const(0, Lyr, R, D)
        self.lnf_w, self.lnf_b = const(1, R, D), const(0, R, D)
        self.head_w, self.head_b = normal(R, D), const(0, R)

    LAYER_PARAMS = ("ln1_w", "ln1_b", "qkv_w", "qkv_b", "out_w", "out_b", "ln2_w", "ln2_b", "ff1_w", "ff1_b", "ff2_w", "ff2_b")
    """Parameters with a leading layer axis: their model axis is 1 (0 for the others)."""

    @staticmethod
    def _ln(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.layer_norm(x, x.shape[-1:])
        return x * w[:, None, None, :] + b[:, None, None, :]

    def check_inputs(self, inputs: object) -> torch.Tensor:
        """``inputs`` if it is a long ``(n_models, B, S)`` tensor of ids in ``[0, n_tokens)`` with ``S <= max_positions``.

        Dense with data behind it (``valuelab._engine.checks.dense``: an
        efficient zero tensor comes back materialised, a meta one is
        refused); TypeError or ValueError naming ``inputs`` otherwise.
        """
        if not isinstance(inputs, torch.Tensor) or inputs.dtype != torch.long:
            raise TypeError("inputs must be a long tensor of token ids")
        if inputs.dim() != 3 or inputs.shape[0] != self.n_models:
            raise ValueError(f"inputs must have shape (n_models={self.n_models}, B, S), got {tuple(inputs.shape)}")
        if inputs.shape[2] > self.max_positions:
            raise ValueError(f"inputs: {inputs.shape[2]} positions, more than max_positions = {self.max_positions}")
        return check_index_range(inputs, "inputs", 0, self.n_tokens - 1, dtypes=(torch.long,),
                                 message=f"inputs must hold ids in [0, {self.n_tokens})")

    def hidden(self, inputs: torch.Tensor) -> torch.Tensor:
        """The last hidden states :math:`h_j`, shape ``(R, B, S, d_model)``, of ``inputs`` ``(R, B, S)`` long.

        Position j attends to positions 0..j only, so :math:`h_j` depends on
        :math:`x_0..x_j` alone (whatever follows, padding included).
        """
        inputs = self.check_inputs(inputs)
        R, B, S = inputs.shape
        H, D = self.n_heads, self.d_model
        dh = D // H
        idx = torch.arange(R, device=inputs.device)[:, None, None]
        x = self.tok[idx, inputs] + self.pos[:, None, :S, :]  # (R, B, S, D)
        for layer in range(self.n_layers):
            h = self._ln(x, self.ln1_w[layer], self.ln1_b[layer])
            qkv = torch.einsum("rbsd,rde->rbse", h, self.qkv_w[layer]) + self.qkv_b[layer][:, None, None, :]
            q, k, v = qkv.reshape(R * B, S, 3, H, dh).permute(2, 0, 3, 1, 4)  # each (R * B, H, S, dh)
            att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            att = att.transpose(1, 2).reshape(R, B, S, D)
            x = x + torch.einsum("rbsd,rde->rbse", att, self.out_w[layer]) + self.out_b[layer][:, None, None, :]
            h = self._ln(x, self.ln2_w[layer], self.ln2_b[layer])
            h = torch.nn.functional.gelu(torch.einsum("rbsd,rdf->rbsf", h, self.ff1_w[layer]) + self.ff1_b[layer][:, None, None, :])
            x = x + torch.einsum("rbsf,rfd->rbsd", h, self.ff2_w[layer]) + self.ff2_b[layer][:, None, None, :]
        return self._ln(x, self.lnf_w, self.lnf_b)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """The head at every position, :math:`w^\\top h_j + b`, shape ``(R, B, S)``."""
        h = self.hidden(inputs)
        return torch.einsum("rbsd,rd->rbs", h, self.head_w) + self.head_b[:, None, None]


def sequence_inputs(world: PromptWorld, batch: PromptBatch, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The model's input ``(R, B, T + 1)``: the prompt token, then the response (chapter 13 (:doc:`/chapters/13_transformer_critic`)).

    Position 0 holds ``vocab_size + prompt``, position ``j >= 1`` holds
    :math:`a_{j-1}` (padding: token 0, which no earlier position reads).
    ``rows`` (R, B) long picks, for each model, the batch rows it reads
    (None: one model reads every row).
    """
    if not isinstance(world, PromptWorld):
        raise TypeError(f"world must be a PromptWorld, got {type(world).__name__}")
    if not isinstance(batch, PromptBatch):
        raise TypeError(f"batch must be a PromptBatch, got {type(batch).__name__}")
    ro = batch.rollout
    seq = torch.cat([(world.vocab_size + batch.prompt)[:, None], ro.tokens], dim=1)  # (B_all, T + 1)
    if rows is None:
        return seq[None]
    if not isinstance(rows, torch.Tensor) or rows.dtype != torch.long or rows.dim() != 2:
        raise TypeError("rows must be an (R, B) long tensor of batch rows")
    rows = check_index_range(rows, "rows", 0, seq.shape[0] - 1, dtypes=(torch.long,),  # the checked tensor is the one read
                             message=f"rows must index the batch's {seq.shape[0]} rows")
    return seq[rows]


def state_values(model: TinyTransformer, inputs: torch.Tensor) -> torch.Tensor:
    """:math:`V(s_t)` for :math:`t = 0..T-1`, the head at position :math:`t`, equation :eq:`eq-critic-alignment` of chapter 13 (:doc:`/chapters/13_transformer_critic`).

    ``inputs`` from :func:`sequence_inputs`, shape ``(R, B, T + 1)``; the
    result ``(R, B, T)`` lines up with the rollout's ``(B, T)`` tensors: entry
    t is the value of the state *before* token t. The last position (which
    has read the whole response) is not a state value and is dropped.
    """
    if not isinstance(model, TinyTransformer):
        raise TypeError(f"model must be a TinyTransformer, got {type(model).__name__}")
    return model(model.check_inputs(inputs))[..., :-1]


def final_scores(model: TinyTransformer, inputs: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The reward model's score of each finished response, the head at position :math:`n` (chapter 13 (:doc:`/chapters/13_transformer_critic`)).

    ``inputs`` (R, B, T + 1) from :func:`sequence_inputs`; ``lengths`` (R, B)
    or (B,) long, the number of generated tokens n of each response (the
    position that has read its last token). Returns ``(R, B)``.
    """
    if not isinstance(model, TinyTransformer):
        raise TypeError(f"model must be a TinyTransformer, got {type(model).__name__}")
    inputs = model.check_inputs(inputs)
    if not isinstance(lengths, torch.Tensor) or lengths.dtype != torch.long:
        raise TypeError("lengths must be a long tensor")
    lengths = dense(lengths, "lengths")  # a freed storage refused before a view of it is taken
    if lengths.dim() == 1 and lengths.shape[0] == inputs.shape[1]:
        lengths = lengths.expand(inputs.shape[:2])
    if lengths.shape != inputs.shape[:2]:
        raise ValueError(f"lengths must have shape (B,) or {tuple(inputs.shape[:2])}, got {tuple(lengths.shape)}")
    lengths = check_index_range(lengths, "lengths", 1, inputs.shape[-1] - 1, dtypes=(torch.long,),
                                message="lengths must lie in [1, T]: a response has at least one token and fits the input")
    return model(inputs).gather(-1, lengths[..., None]).squeeze(-1)


def reward_model_start(reward_model: TinyTransformer) -> TinyTransformer:
    """A critic started from the reward model: every weight copied, the head reused (chapter 13 (:doc:`/chapters/13_transformer_critic`)).

    The copy shares no storage with the reward model, so training the critic
    leaves the reward model as it was.
    """
    if not isinstance(reward_model, TinyTransformer):
        raise TypeError(f"reward_model must be a TinyTransformer, got {type(reward_model).__name__}")
    return copy.deepcopy(reward_model)


def tile(model: TinyTransformer, times: int) -> TinyTransformer:
    """An ensemble of ``times * n_models`` models: ``times`` copies of ``model``'s, copy-major (chapter 13 (:doc:`/chapters/13_transformer_critic`)).

    Model ``c * n_models + r`` of the result starts as model ``r`` of
    ``model``: one reward model per seed, started as critics under several
    configurations at once. The result shares no storage with ``model``.
    """
    if not isinstance(model, TinyTransformer):
        raise TypeError(f"model must be a TinyTransformer, got {type(model).__name__}")
    times = check_positive_int(times, "times")
    params = dict(model.named_parameters())
    device = next(iter(params.values())).device
    check_memory(times * sum(p.numel() * p.element_size() for p in params.values()), "times", device)
    out = copy.deepcopy(model)
    out.n_models = model.n_models * times
    with torch.no_grad():
        for name, p in params.items():
            axis = 1 if name in TinyTransformer.LAYER_PARAMS else 0
            reps = [1] * p.dim()
            reps[axis] = times
            setattr(out, name, nn.Parameter(p.detach().repeat(*reps)))  # copy-major, as torch.cat([p] * times)
    return out


def select(model: TinyTransformer, models: Sequence[int]) -> TinyTransformer:
    """An ensemble of the chosen models of ``model``, in the order given (chapter 13 (:doc:`/chapters/13_transformer_critic`)).

    Model ``i`` of the result starts as model ``models[i]`` of ``model``:
    chapter 13 trains twenty reward models (one per seed) and pretrains
    critics from the first eight. Indices must be distinct ints in
    ``[0, n_models)``. The result shares no storage with ``model``.
    """
    if not isinstance(model, TinyTransformer):
        raise TypeError(f"model must be a TinyTransformer, got {type(model).__name__}")
    if isinstance(models, (str, bytes)) or not isinstance(models, (Sequence, range)):
        raise TypeError(f"models must be a sequence of ints, got {type(models).__name__}")
    idx = [check_int(i, "models") for i in models]
    if not idx:
        raise ValueError("models must name at least one model")
    if any(not 0 <= i < model.n_models for i in idx):
        raise ValueError(f"models must lie in [0, {model.n_models}), got {idx}")
    if len(set(idx)) != len(idx):
        raise ValueError(f"models must be distinct, got {idx}")
    out = copy.deepcopy(model)
    out.n_models = len(idx)
    where = torch.tensor(idx, dtype=torch.long)
    with torch.no_grad():
        for name, p in model.named_parameters():
            axis = 1 if name in TinyTransformer.LAYER_PARAMS else 0
            setattr(out, name, nn.Parameter(p.detach().index_select(axis, where.to(p.device)).clone()))
    return out

def explained_variance(prediction: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """:math:`1 - \\sum m\\,(y - \\hat y - \\overline{y - \\hat y})^2 / \\sum m\\,(y - \\bar y)^2` over the valid entries along ``dim`` (chapter 13 (:doc:`/chapters/13_transformer_critic`)).

    The statistic trainers log for the critic (1: perfect, 0: no better than
    the mean, negative: worse). ``mask`` bool of the same shape, on the same
    device. Taken in float64 on power-of-two scales (finite inputs never
    overflow on the way), returned in ``target``'s dtype. Raises
    ``ValueError`` when the target has no spread, when an entry of
    ``prediction`` or ``target`` is NaN or inf (masked ones included: fill
    padding with 0), or when the result does not fit the dtype.
    """
    for name, x in (("prediction", prediction), ("target", target)):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"{name} must be a float tensor")
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError("mask must be a bool tensor")
    if prediction.shape != target.shape or mask.shape != target.shape:
        raise ValueError("prediction, target and mask must have the same shape")
    prediction, target, mask = dense(prediction, "prediction"), dense(target, "target"), dense(mask, "mask")
    if not prediction.device == target.device == mask.device:
        raise ValueError(f"prediction, target and mask must be on one device, got {prediction.device}, {target.device}, {mask.device}")
    dim = check_dim(dim, target.dim(), shape_of=f"a target of shape {tuple(target.shape)}")
    require_finite(prediction, "prediction", mask)
    require_finite(target, "target", mask)
    too_far = f"prediction: its errors are so much larger than the spread of target that the explained variance overflows {target.dtype}"
    ev = _explained_variance(target, prediction, mask.to(torch.float64), dim,
                             "target has no spread over the valid entries: explained variance is undefined", too_far)
    return require_finite_result(ev.to(target.dtype), *too_far.split(": ", 1))
