"""Slips for chapter 10 (long responses: signal decay, a wrong critic, decoupled and length-adaptive λ)."""
from mutations import Slip

CHAPTER = "10_long_responses.ipynb"
# the code cells that prove each general proposition (the instance checks after them are not listed)
PROOFS = {
    "prop-signal-decay": (5,),
    "prop-gae-critic-error": (20,),
    "prop-decoupled-target": (39,),
    "prop-adaptive-lambda": (51,),
}
MUTATIONS = [
    Slip(name="decay-power-off-by-one", aims_at="prop-signal-decay", cell=5, old="return x ** (T - j)\n",
         new="return x ** (T - j + 1)\n",
         why="the score's weight counted with the response length T + 1 instead of the last index T"),
    Slip(name="horizon-one-short", aims_at="prop-signal-decay", cell=5,
         old="horizon = sp.summation((gamma * lam) ** l, (l, 0, T - t))",
         new="horizon = sp.summation((gamma * lam) ** l, (l, 0, T - t - 1))",
         why="the effective horizon summed without the last TD error"),
    Slip(name="critic-error-without-1-minus-lambda", aims_at="prop-gae-critic-error", cell=20,
         old="claim = lambda e_t, W_t: -e_t + gamma * (1 - lam) * W_t",
         new="claim = lambda e_t, W_t: -e_t + gamma * W_t",
         why="the later errors enter without the factor (1 - lambda)"),
    Slip(name="tail-sum-wrong-power", aims_at="prop-gae-critic-error", cell=20,
         old="return sp.Sum(gl ** (l - 1) * e[j + l], (l, 1, T - j))",
         new="return sp.Sum(gl ** l * e[j + l], (l, 1, T - j))",
         why="the tail sum weighted (gamma lambda)^l, one power too many"),
    Slip(name="float-check-without-1-minus-lambda", aims_at=22, cell=22,
         old="assert torch.allclose(D_lib, -err_e + g_e * (1 - lm_e) * W_lib",
         new="assert torch.allclose(D_lib, -err_e + g_e * W_lib",
         why="the floating-point check of the same dropped factor"),
    Slip(name="average-response-unscored", aims_at=34, cell=34, old="avg_score[-1] = world.v0",
         new="avg_score[-1] = 0.0",
         why="the average response of eq-signed-bias without its average score"),
    Slip(name="telescoping-last-index", aims_at="prop-decoupled-target", cell=39,
         old="last, first = sp.Sum(f_V, (l, T - t + 1, T - t + 1))",
         new="last, first = sp.Sum(f_V, (l, T - t, T - t))", why="the shifted sum split at T - t instead of T - t + 1"),
    Slip(name="telescoping-bootstrap-power", aims_at="prop-decoupled-target", cell=39,
         old="- (R_sum + gamma ** (T - t + 1) * V[T + 1])",
         new="- (R_sum + gamma ** (T - t) * V[T + 1])",
         why="the value after EOS discounted by gamma^(T-t), one power short"),
    Slip(name="adaptive-variance-from-own-token", aims_at="prop-adaptive-lambda", cell=51,
         old="var_sum = general_branch(sp.summation(lam ** (2 * j), (j, 1, n_later)))",
         new="var_sum = general_branch(sp.summation(lam ** (2 * j), (j, 0, n_later)))",
         why="the variance series counts the token's own TD error, which the exact critic makes exact"),
    Slip(name="td-error-without-gamma", aims_at="prop-gae-critic-error", function="valuelab.symbolic:td_error",
         old="s.gamma * s.V[t + 1]",
         new="s.V[t + 1]", why="the TD error with an undiscounted next value"),
]
