"""valuelab.lab.transformer: shapes, causality, the alignment of V(s_t), padding, independent models, the RM start."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import valuelab as vl
from valuelab.lab.critic import propagation_fraction
from valuelab.lab.policy import count_good, evaluate_policy, make_prompt_world, sample_responses
from valuelab.lab.transformer import (
    TinyTransformer,
    explained_variance,
    final_scores,
    reward_model_start,
    sequence_inputs,
    state_values,
    select,
    tile,
)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module")
def world():
    return make_prompt_world(n_prompts=3, vocab_size=3, max_len=8, eos_range=(0.1, 0.2),
                             score_fn=functools.partial(count_good, scale=4.0), max_count=4, seed=0)


def _batch(world, runs=2, g=4, seed=0):
    probs = torch.as_tensor(world.reference_policy(), dtype=torch.float64)[None].repeat(runs, 1, 1, 1, 1, 1)
    ev = evaluate_policy(world, probs)
    return sample_responses(world, probs, g, [seed + r for r in range(runs)], evaluation=ev)


def _model(world, n_models=2, seed=0, **kw):
    return TinyTransformer(n_models, world.vocab_size + world.n_prompts, world.max_len + 1, seed=seed, **kw)


def test_shapes(world):
    b = _batch(world)
    B, T = b.rollout.tokens.shape
    rows = torch.arange(B).reshape(2, -1)
    x = sequence_inputs(world, b, rows)
    assert x.shape == (2, B // 2, T + 1) and x.dtype == torch.long
    m = _model(world)
    assert m.hidden(x).shape == (2, B // 2, T + 1, m.d_model)
    assert m(x).shape == (2, B // 2, T + 1)
    assert state_values(m, x).shape == (2, B // 2, T)
    n = b.rollout.lengths[rows]
    assert final_scores(m, x, n).shape == (2, B // 2)
    assert sequence_inputs(world, b).shape == (1, B, T + 1)


def test_sequence_layout_is_prompt_then_response(world):
    b = _batch(world)
    x = sequence_inputs(world, b)[0]
    assert torch.equal(x[:, 0], world.vocab_size + b.prompt)
    assert torch.equal(x[:, 1:], b.rollout.tokens)


def test_hidden_state_at_j_depends_on_positions_up_to_j_only(world):
    torch.manual_seed(0)
    m = _model(world, n_models=1)
    S = world.max_len + 1
    x = torch.randint(0, m.n_tokens, (1, 6, S))
    h = m.hidden(x)
    for j in range(S):
        y = x.clone()
        y[..., j:] = torch.randint(0, m.n_tokens, y[..., j:].shape)
        y[..., j] = (x[..., j] + 1) % m.n_tokens  # position j surely changes
        hy = m.hidden(y)
        torch.testing.assert_close(hy[..., :j, :], h[..., :j, :], rtol=0, atol=1e-6)
        assert (hy[..., j, :] - h[..., j, :]).abs().max() > 1e-4


def test_state_value_at_t_is_blind_to_token_t_and_after(world):
    """The alignment: V(s_t) reads the prompt and a_0..a_{t-1}, never a_t (verl issues 847 and 1960)."""
    b = _batch(world)
    x = sequence_inputs(world, b)
    m = _model(world, n_models=1)
    v = state_values(m, x)
    T = v.shape[-1]
    for t in range(T):
        y = x.clone()
        y[..., 1 + t] = (x[..., 1 + t] + 1) % world.vocab_size  # change a_t
        vy = state_values(m, y)
        torch.testing.assert_close(vy[..., : t + 1], v[..., : t + 1], rtol=0, atol=1e-6)  # V(s_0..s_t) unchanged
        if t + 1 < T:
            assert (vy[..., t + 1] - v[..., t + 1]).abs().max() > 1e-5  # V(s_{t+1}) has read a_t
    # V(s_0) is a function of the prompt alone
    same_prompt = b.prompt == b.prompt[0]
    assert torch.allclose(v[0, same_prompt, 0], v[0, same_prompt, 0][0].expand(int(same_prompt.sum())), atol=1e-6)


def test_the_off_by_one_reads_the_action(world):
    """Position t + 1, the slice a trainer gets wrong, is not blind to a_t: planted slip of the alignment test."""
    b = _batch(world)
    x = sequence_inputs(world, b)
    m = _model(world, n_models=1)
    wrong = m(x)[..., 1:]
    y = x.clone()
    y[..., 1] = (x[..., 1] + 1) % world.vocab_size  # change a_0
    assert (m(y)[..., 1:][..., 0] - wrong[..., 0]).abs().max() > 1e-5


def test_final_score_reads_the_position_of_the_last_token(world):
    b = _batch(world)
    x = sequence_inputs(world, b)
    m = _model(world, n_models=1)
    n = b.rollout.lengths
    full = m(x)[0]
    torch.testing.assert_close(final_scores(m, x, n)[0], full[torch.arange(x.shape[1]), n])
    # the score does not change with what follows the response (padding)
    y = x.clone()
    for i, ni in enumerate(n.tolist()):
        y[0, i, ni + 1:] = 2
    torch.testing.assert_close(final_scores(m, y, n), final_scores(m, x, n), rtol=0, atol=1e-6)


def test_values_at_valid_positions_do_not_depend_on_padding(world):
    b = _batch(world)
    x = sequence_inputs(world, b)
    m = _model(world, n_models=1)
    v = state_values(m, x)
    y = x.clone()
    y[0][~torch.cat([torch.ones_like(b.rollout.mask[:, :1]), b.rollout.mask], 1)] = 1  # garbage in the padding
    torch.testing.assert_close(state_values(m, y)[0][b.rollout.mask], v[0][b.rollout.mask], rtol=0, atol=1e-6)


def test_models_are_independent_and_tile_copies(world):
    m = _model(world, n_models=3, seed=4)
    x = torch.randint(0, m.n_tokens, (3, 5, 7))
    out = m(x)
    y = x.clone()
    y[1] = torch.randint(0, m.n_tokens, y[1].shape)
    out_y = m(y)
    torch.testing.assert_close(out_y[[0, 2]], out[[0, 2]], rtol=0, atol=1e-6)  # model 1's input moves model 1 only
    big = tile(m, 2)
    assert big.n_models == 6
    out_big = big(torch.cat([x, x]))
    torch.testing.assert_close(out_big[:3], out, rtol=0, atol=1e-6)
    torch.testing.assert_close(out_big[3:], out, rtol=0, atol=1e-6)
    for p_big, p in zip(big.parameters(), m.parameters()):
        assert p_big.data_ptr() != p.data_ptr()


def test_reward_model_start_copies_every_weight_and_shares_nothing(world):
    rm = _model(world, n_models=2)
    critic = reward_model_start(rm)
    x = torch.randint(0, rm.n_tokens, (2, 4, 6))
    torch.testing.assert_close(critic(x), rm(x), rtol=0, atol=0)
    before = rm(x).detach().clone()
    with torch.no_grad():
        for p in critic.parameters():
            p.add_(1.0)
    torch.testing.assert_close(rm(x), before, rtol=0, atol=0)


def test_gradients_reach_every_parameter(world):
    b = _batch(world)
    x = sequence_inputs(world, b)
    m = _model(world, n_models=1)
    ro = b.rollout
    v = state_values(m, x)[0]
    loss = vl.value_loss(v, ro.values_exact.float(), mask=ro.mask)
    loss.backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("device", DEVICES)
def test_runs_on_the_device_of_its_inputs(world, device):
    m = _model(world, n_models=2).to(device)
    x = torch.randint(0, m.n_tokens, (2, 3, 5), device=device)
    assert m(x).device.type == device


def test_explained_variance_matches_its_definition():
    g = torch.Generator().manual_seed(0)
    y = torch.randn(3, 50, generator=g, dtype=torch.float64)
    p = y + 0.3 * torch.randn(3, 50, generator=g, dtype=torch.float64)
    mask = torch.rand(3, 50, generator=g) > 0.2
    got = explained_variance(p, y, mask)
    for r in range(3):
        yy, pp = y[r][mask[r]].numpy(), p[r][mask[r]].numpy()
        want = 1 - np.var(yy - pp) / np.var(yy)
        assert abs(float(got[r]) - want) < 1e-12
    assert torch.allclose(explained_variance(y, y, mask), torch.ones(3, dtype=torch.float64))
    const = y.mean(-1, keepdim=True).expand_as(y)
    assert (explained_variance(const, y, torch.ones_like(mask)).abs() < 1e-12).all()


def test_propagation_fraction_is_the_binomial_law():
    from math import comb

    for d in (1, 2, 5, 16):
        for lam in (0.0, 0.5, 0.95, 1.0):
            assert propagation_fraction(0, d, lam) == 0.0
            assert abs(propagation_fraction(d, d, lam) - 1.0) < 1e-12  # d refreshes always reach the first token
            for k in range(1, d + 1):
                want = sum(comb(d - 1, i) * (1 - lam) ** i * lam ** (d - 1 - i) for i in range(k))
                assert abs(propagation_fraction(k, d, lam) - want) < 1e-12
    assert propagation_fraction(1, 16, 1.0) == 1.0  # Monte Carlo: one refresh
    assert propagation_fraction(15, 16, 0.0) == 0.0  # TD(0): sixteen refreshes for sixteen tokens


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda w: TinyTransformer(0, 5, 4), ValueError),
        (lambda w: TinyTransformer(1, 5, 4, d_model=6, n_heads=4), ValueError),
        (lambda w: TinyTransformer(1, 5, 4, seed=1.5), TypeError),
        (lambda w: _model(w, 1)(torch.zeros(1, 2, 3)), TypeError),
        (lambda w: _model(w, 1)(torch.zeros(2, 2, 3, dtype=torch.long)), ValueError),
        (lambda w: _model(w, 1)(torch.zeros(1, 2, w.max_len + 2, dtype=torch.long)), ValueError),
        (lambda w: _model(w, 1)(torch.full((1, 2, 3), 99, dtype=torch.long)), ValueError),
        (lambda w: sequence_inputs(w, "batch"), TypeError),
        (lambda w: sequence_inputs(w, _batch(w), torch.zeros(2, 2)), TypeError),
        (lambda w: sequence_inputs(w, _batch(w), torch.full((1, 2), 999, dtype=torch.long)), ValueError),
        (lambda w: final_scores(_model(w, 1), sequence_inputs(w, _batch(w)), torch.zeros(3, dtype=torch.long)), ValueError),
        (lambda w: final_scores(_model(w, 1), sequence_inputs(w, _batch(w)), torch.zeros(24)), TypeError),
        (lambda w: state_values("model", None), TypeError),
        (lambda w: reward_model_start("model"), TypeError),
        (lambda w: tile(_model(w, 1), 0), ValueError),
        (lambda w: explained_variance(torch.ones(4), torch.ones(4), torch.ones(4, dtype=torch.bool)), ValueError),
        (lambda w: explained_variance(torch.ones(4), torch.ones(4), torch.ones(4)), TypeError),
        (lambda w: explained_variance(torch.ones(4), torch.ones(3), torch.ones(4, dtype=torch.bool)), ValueError),
        (lambda w: propagation_fraction(-1, 3, 0.5), ValueError),
        (lambda w: propagation_fraction(1, 3, 1.5), ValueError),
    ],
)
def test_bad_arguments_raise(world, call, error):
    with pytest.raises(error):
        call(world)


# ---------------------------------------------------------------------------
# the forward pass against one written out from its definition, model by model and head by head
# ---------------------------------------------------------------------------


def _layer_norm(x, w, b):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)  # biased, eps 1e-5 inside the root (torch's layer_norm)
    return (x - mu) / torch.sqrt(var + 1e-5) * w + b


def _gelu(x):
    return 0.5 * x * (1 + torch.erf(x / np.sqrt(2.0)))


def forward_by_hand(m, inputs):
    """(R, B, S) float64: every model alone, every head alone, the causal softmax written with a mask."""
    P = {name: p.detach().double() for name, p in m.named_parameters()}
    R, B, S = inputs.shape
    D, H = m.d_model, m.n_heads
    dh = D // H
    out = torch.zeros(R, B, S, dtype=torch.float64)
    causal = torch.tril(torch.ones(S, S, dtype=torch.bool))
    for r in range(R):
        x = P["tok"][r][inputs[r]] + P["pos"][r][:S]  # (B, S, D)
        for layer in range(m.n_layers):
            def w(name):
                return P[name][layer, r]
            h = _layer_norm(x, w("ln1_w"), w("ln1_b"))
            qkv = h @ w("qkv_w") + w("qkv_b")  # (B, S, 3D): q, then k, then v, each split into heads
            heads = []
            for i in range(H):
                q = qkv[..., i * dh:(i + 1) * dh]
                k = qkv[..., D + i * dh:D + (i + 1) * dh]
                v = qkv[..., 2 * D + i * dh:2 * D + (i + 1) * dh]
                scores = (q @ k.transpose(-1, -2)) / np.sqrt(dh)
                scores = scores.masked_fill(~causal, float("-inf"))
                heads.append(torch.softmax(scores, -1) @ v)
            x = x + torch.cat(heads, -1) @ w("out_w") + w("out_b")
            h = _layer_norm(x, w("ln2_w"), w("ln2_b"))
            x = x + _gelu(h @ w("ff1_w") + w("ff1_b")) @ w("ff2_w") + w("ff2_b")
        h = _layer_norm(x, P["lnf_w"][r], P["lnf_b"][r])
        out[r] = h @ P["head_w"][r] + P["head_b"][r]
    return out


@pytest.mark.parametrize("kw", [dict(), dict(d_model=12, n_layers=3, n_heads=3, d_ff=10)])
def test_forward_matches_the_definition(kw):
    m = TinyTransformer(2, 9, 7, seed=3, **kw)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # every weight away from its start (LayerNorm gains and biases included)
        for p in m.parameters():
            p.copy_(p + 0.3 * torch.randn(p.shape, generator=g))
    x = torch.randint(0, 9, (2, 4, 6), generator=g)
    torch.testing.assert_close(m(x).double(), forward_by_hand(m, x), rtol=0, atol=2e-5)
    torch.testing.assert_close(state_values(m, x).double(), forward_by_hand(m, x)[..., :-1], rtol=0, atol=2e-5)
    lengths = torch.tensor([[1, 5, 3, 2], [4, 1, 5, 5]])
    want = forward_by_hand(m, x).gather(-1, lengths[..., None])[..., 0]
    torch.testing.assert_close(final_scores(m, x, lengths).double(), want, rtol=0, atol=2e-5)
    torch.testing.assert_close(final_scores(m, x, lengths[0]).double(), forward_by_hand(m, x).gather(
        -1, lengths[0].expand(2, 4)[..., None])[..., 0], rtol=0, atol=2e-5)  # (B,) lengths: the same for every model


def test_initial_weights_are_gpt2s():
    m = TinyTransformer(3, 50, 40, d_model=64, n_layers=2, n_heads=4, d_ff=128, seed=0)
    shapes = dict(tok=(3, 50, 64), pos=(3, 40, 64), ln1_w=(2, 3, 64), ln1_b=(2, 3, 64), qkv_w=(2, 3, 64, 192),
                  qkv_b=(2, 3, 192), out_w=(2, 3, 64, 64), out_b=(2, 3, 64), ln2_w=(2, 3, 64), ln2_b=(2, 3, 64),
                  ff1_w=(2, 3, 64, 128), ff1_b=(2, 3, 128), ff2_w=(2, 3, 128, 64), ff2_b=(2, 3, 64), lnf_w=(3, 64),
                  lnf_b=(3, 64), head_w=(3, 64), head_b=(3,))
    params = dict(m.named_parameters())
    assert set(params) == set(shapes)
    for name, shape in shapes.items():
        p = params[name].detach()
        assert p.shape == shape and p.dtype == torch.float32, name
        if name.endswith("_b"):
            assert (p == 0).all(), name
        elif name.startswith("ln"):
            assert (p == 1).all(), name
        else:
            assert abs(float(p.std()) - 0.02) < 0.002 and abs(float(p.mean())) < 0.002, name
    assert (m.n_models, m.n_tokens, m.max_positions, m.d_model, m.n_layers, m.n_heads, m.d_ff) == (3, 50, 40, 64, 2, 4, 128)
    d = TinyTransformer(1, 5, 4)
    assert (d.d_model, d.n_layers, d.n_heads, d.d_ff) == (32, 2, 2, 64)


def test_the_seed_fixes_the_weights_and_none_draws_from_the_global_rng():
    a, b, c = (TinyTransformer(2, 5, 4, seed=s) for s in (7, 7, 8))
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        if name in ("tok", "pos", "head_w"):
            assert not torch.equal(pa, pc), name
    assert not torch.equal(a.tok[0], a.tok[1])  # the models of one draw differ
    torch.manual_seed(123)
    g1 = TinyTransformer(2, 5, 4)
    torch.manual_seed(123)
    g2 = TinyTransformer(2, 5, 4)
    assert torch.equal(g1.tok, g2.tok) and torch.equal(g1.head_w, g2.head_w)
    state = torch.random.get_rng_state()
    TinyTransformer(2, 5, 4, seed=1)
    assert torch.equal(torch.random.get_rng_state(), state)  # a seeded model leaves the global RNG alone


def test_tile_stacks_models_on_their_axis():
    m = TinyTransformer(2, 6, 5, seed=0)
    big = tile(m, 3)
    assert big.n_models == 6 and m.n_models == 2
    for name, p in m.named_parameters():
        q = getattr(big, name)
        axis = 1 if name in TinyTransformer.LAYER_PARAMS else 0
        assert q.shape[axis] == 3 * p.shape[axis] and isinstance(q, torch.nn.Parameter), name
        for c in range(3):
            torch.testing.assert_close(q.narrow(axis, 2 * c, 2), p, rtol=0, atol=0)
    assert tile(m, 1).n_models == 2


def test_select_picks_models_in_order_and_copies():
    m = TinyTransformer(4, 6, 5, seed=0)
    sub = select(m, [2, 0])
    assert sub.n_models == 2 and m.n_models == 4
    for name, p in m.named_parameters():
        q = getattr(sub, name)
        axis = 1 if name in TinyTransformer.LAYER_PARAMS else 0
        assert isinstance(q, torch.nn.Parameter) and q.shape[axis] == 2, name
        torch.testing.assert_close(q.narrow(axis, 0, 1), p.narrow(axis, 2, 1), rtol=0, atol=0)
        torch.testing.assert_close(q.narrow(axis, 1, 1), p.narrow(axis, 0, 1), rtol=0, atol=0)
        assert q.data_ptr() != p.data_ptr()
    x = torch.randint(0, 6, (4, 3, 5))
    with torch.no_grad():  # each selected model computes what it computed inside the big ensemble
        torch.testing.assert_close(sub(x[[2, 0]]), m(x)[[2, 0]], rtol=1e-6, atol=1e-6)
        sub.head_b.add_(1.0)
    assert float(m.head_b.abs().max()) == 0.0  # no shared storage
    assert select(m, range(4)).n_models == 4


def test_final_score_bounds():
    m = TinyTransformer(1, 6, 5, seed=0)
    x = torch.randint(0, 6, (1, 2, 5))
    final_scores(m, x, torch.tensor([1, 4]))  # 1 and T (= 4) are both allowed
    with pytest.raises(ValueError, match=r"^lengths must lie in \[1, T\]: a response has at least one token and fits the input$"):
        final_scores(m, x, torch.tensor([0, 4]))
    with pytest.raises(ValueError, match=r"^lengths must lie in \[1, T\]"):
        final_scores(m, x, torch.tensor([1, 5]))
    with pytest.raises(ValueError, match=r"^lengths must have shape \(B,\) or \(1, 2\), got \(3,\)$"):
        final_scores(m, x, torch.tensor([1, 2, 3]))
    assert final_scores(m, x[:, :0], torch.zeros(1, 0, dtype=torch.long)).shape == (1, 0)


def test_explained_variance_along_another_axis_and_with_empty_slices():
    g = torch.Generator().manual_seed(2)
    y = torch.randn(40, 3, generator=g, dtype=torch.float64)
    p = y + 0.5 * torch.randn(40, 3, generator=g, dtype=torch.float64)
    mask = torch.ones(40, 3, dtype=torch.bool)
    mask[:10, 1] = False
    got = explained_variance(p, y, mask, dim=0)
    for c in range(3):
        yy, pp = y[:, c][mask[:, c]].numpy(), p[:, c][mask[:, c]].numpy()
        assert float(got[c]) == pytest.approx(1 - np.var(yy - pp) / np.var(yy), abs=1e-12)
    y2 = torch.tensor([[1.0, 3.0, 0.0], [2.0, 2.0, 2.0]])
    m2 = torch.tensor([[True, True, False], [True, True, True]])
    with pytest.raises(ValueError, match=r"^target has no spread over the valid entries: explained variance is undefined$"):
        explained_variance(y2, y2, m2)
    assert float(explained_variance(torch.tensor([[2.0, 2.0, 9.0]]), torch.tensor([[1.0, 3.0, 0.0]]),
                                    torch.tensor([[True, True, False]]))[0]) == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda w: TinyTransformer(0, 5, 4), ValueError, r"^n_models must be a positive int, got 0$"),
        (lambda w: TinyTransformer(1, 0, 4), ValueError, r"^n_tokens must be a positive int, got 0$"),
        (lambda w: TinyTransformer(1, 5, 0), ValueError, r"^max_positions must be a positive int, got 0$"),
        (lambda w: TinyTransformer(1, 5, 4, d_model=0), ValueError, r"^d_model must be a positive int, got 0$"),
        (lambda w: TinyTransformer(1, 5, 4, n_layers=0), ValueError, r"^n_layers must be a positive int, got 0$"),
        (lambda w: TinyTransformer(1, 5, 4, n_heads=0), ValueError, r"^n_heads must be a positive int, got 0$"),
        (lambda w: TinyTransformer(1, 5, 4, d_ff=0), ValueError, r"^d_ff must be a positive int, got 0$"),
        (lambda w: TinyTransformer(1, 5, 4, d_model=6, n_heads=4), ValueError,
         r"^n_heads must divide d_model, got d_model=6, n_heads=4$"),
        (lambda w: TinyTransformer(1, 5, 4, seed=1.5), TypeError, r"^seed must be an int"),
        (lambda w: _model(w, 1)(torch.zeros(1, 2, 3)), TypeError, r"^inputs must be a long tensor of token ids$"),
        (lambda w: _model(w, 1)([[0]]), TypeError, r"^inputs must be a long tensor of token ids$"),
        (lambda w: _model(w, 1)(torch.zeros(2, 2, 3, dtype=torch.long)), ValueError,
         r"^inputs must have shape \(n_models=1, B, S\), got \(2, 2, 3\)$"),
        (lambda w: _model(w, 1)(torch.zeros(1, 2, dtype=torch.long)), ValueError,
         r"^inputs must have shape \(n_models=1, B, S\), got \(1, 2\)$"),
        (lambda w: _model(w, 1)(torch.zeros(1, 2, w.max_len + 2, dtype=torch.long)), ValueError,
         r"^inputs: 10 positions, more than max_positions = 9$"),
        (lambda w: _model(w, 1)(torch.full((1, 2, 3), 6, dtype=torch.long)), ValueError, r"^inputs must hold ids in \[0, 6\)$"),
        (lambda w: _model(w, 1)(torch.full((1, 2, 3), -1, dtype=torch.long)), ValueError, r"^inputs must hold ids in \[0, 6\)$"),
        (lambda w: sequence_inputs("world", _batch(w)), TypeError, r"^world must be a PromptWorld, got str$"),
        (lambda w: sequence_inputs(w, "batch"), TypeError, r"^batch must be a PromptBatch, got str$"),
        (lambda w: sequence_inputs(w, _batch(w), torch.zeros(2, 2)), TypeError,
         r"^rows must be an \(R, B\) long tensor of batch rows$"),
        (lambda w: sequence_inputs(w, _batch(w), torch.zeros(4, dtype=torch.long)), TypeError,
         r"^rows must be an \(R, B\) long tensor of batch rows$"),
        (lambda w: sequence_inputs(w, _batch(w), torch.full((1, 2), 24, dtype=torch.long)), ValueError,
         r"^rows must index the batch's 24 rows$"),
        (lambda w: sequence_inputs(w, _batch(w), torch.full((1, 2), -1, dtype=torch.long)), ValueError,
         r"^rows must index the batch's 24 rows$"),
        (lambda w: final_scores("model", None, None), TypeError, r"^model must be a TinyTransformer, got str$"),
        (lambda w: final_scores(_model(w, 1), sequence_inputs(w, _batch(w)), torch.zeros(24)), TypeError,
         r"^lengths must be a long tensor$"),
        (lambda w: state_values("model", None), TypeError, r"^model must be a TinyTransformer, got str$"),
        (lambda w: reward_model_start("model"), TypeError, r"^reward_model must be a TinyTransformer, got str$"),
        (lambda w: tile("model", 2), TypeError, r"^model must be a TinyTransformer, got str$"),
        (lambda w: tile(_model(w, 1), 0), ValueError, r"^times must be a positive int, got 0$"),
        (lambda w: select("model", [0]), TypeError, r"^model must be a TinyTransformer, got str$"),
        (lambda w: select(_model(w, 2), "01"), TypeError, r"^models must be a sequence of ints, got str$"),
        (lambda w: select(_model(w, 2), [0.0]), TypeError, r"^models must be an int, got float$"),
        (lambda w: select(_model(w, 2), []), ValueError, r"^models must name at least one model$"),
        (lambda w: select(_model(w, 2), [2]), ValueError, r"^models must lie in \[0, 2\), got \[2\]$"),
        (lambda w: select(_model(w, 2), [-1]), ValueError, r"^models must lie in \[0, 2\), got \[-1\]$"),
        (lambda w: select(_model(w, 2), [1, 1]), ValueError, r"^models must be distinct, got \[1, 1\]$"),
        (lambda w: explained_variance(torch.ones(4, dtype=torch.long), torch.ones(4), torch.ones(4, dtype=torch.bool)),
         TypeError, r"^prediction must be a float tensor$"),
        (lambda w: explained_variance(torch.ones(4), [1.0], torch.ones(4, dtype=torch.bool)), TypeError,
         r"^target must be a float tensor$"),
        (lambda w: explained_variance(torch.ones(4), torch.ones(4), torch.ones(4)), TypeError, r"^mask must be a bool tensor$"),
        (lambda w: explained_variance(torch.ones(4), torch.ones(3), torch.ones(4, dtype=torch.bool)), ValueError,
         r"^prediction, target and mask must have the same shape$"),
        (lambda w: explained_variance(torch.ones(4), torch.ones(4), torch.ones(3, dtype=torch.bool)), ValueError,
         r"^prediction, target and mask must have the same shape$"),
    ],
)
def test_bad_arguments_name_themselves(world, call, error, match):
    with pytest.raises(error, match=match):
        call(world)


def test_explained_variance_of_a_single_valid_entry_is_undefined():
    y = torch.tensor([[1.0, 3.0, 5.0], [2.0, 9.0, 9.0]])
    m = torch.tensor([[True, True, True], [True, False, False]])  # row 1: one entry, no spread
    with pytest.raises(ValueError, match=r"^target has no spread over the valid entries"):
        explained_variance(y * 0.5, y, m)
