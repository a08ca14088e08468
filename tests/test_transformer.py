"""valuelab.transformer: shapes, causality, the alignment of V(s_t), padding, independent models, the RM start."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import valuelab as vl
from valuelab.critic import propagation_fraction
from valuelab.policy import count_good, evaluate_policy, make_prompt_world, sample_responses
from valuelab.transformer import (
    TinyTransformer,
    explained_variance,
    final_scores,
    reward_model_start,
    sequence_inputs,
    state_values,
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
