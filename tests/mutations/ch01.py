"""Slips for chapter 1 (value function, Monte-Carlo returns)."""
from mutations import Slip

CHAPTER = "01_value_function_mc.ipynb"
# the code cells that prove each general proposition (the instance checks after them are not listed)
PROOFS = {
    "prop-mc-recursion": (10, 12, 14, 16),
}
MUTATIONS = [
    Slip(name="count-exponent", aims_at=6, cell=6, old="positions = range(t_c, T_c + 1)",
         new="positions = range(t_c, T_c)",
         why="continuations counted over tokens t..T-1: |V|^(T-t), one token short"),
    Slip(name="return-power-off-by-one", aims_at="prop-mc-recursion", cell=8, old="gamma ** (k - start)",
         new="gamma ** (k - start + 1)",
         why="the return discounts its first reward: gamma^(k-t+1)"),
    Slip(name="step1-lower-limit", aims_at="prop-mc-recursion", cell=10, old="(k, t + 1, T))", new="(k, t + 2, T))",
         why="the shifted sum starts one index late"),
    Slip(name="first-term-two-terms", aims_at="prop-mc-recursion", cell=12, old="(k, t, t))", new="(k, t, t + 1))",
         why="the peeled-off first reward includes r_{t+1}"),
    Slip(name="recursion-gamma-squared", aims_at="prop-mc-recursion", cell=14, old="(first_term + gamma * G(t + 1))",
         new="(first_term + gamma**2 * G(t + 1))", why="recursion with the wrong power of gamma"),
    Slip(name="reference-starts-late", aims_at=20, function="valuelab.lab.reference:mc_returns", old="for k in range(t, L)",
         new="for k in range(t + 1, L)", why="the oracle's return omits the reward of its own step"),
    Slip(name="var-1-over-N", aims_at=22, cell=22, old="/ N**2", new="/ N", why="Var of the mean with 1/N, not 1/N^2"),
    Slip(name="second-moment-is-variance", aims_at=22, cell=22, old="2: mu**2 + sigma**2}", new="2: sigma**2}",
         why="E[G^2] taken for Var[G]: the mean's square forgotten"),
    Slip(name="correlated-returns", aims_at=22, cell=22, old="n**2 * mu**2 + n * sigma**2",
         new="n**2 * mu**2 + n**2 * sigma**2",
         why="second moment of the sum as if the returns were one and the same (no independence)"),
    Slip(name="one-sample-reused", aims_at=24, cell=24, old='sps.Bernoulli(f"G{m}"', new='sps.Bernoulli("G"',
         why="the N returns are one random variable, not N independent ones"),
    Slip(name="episode-one-token-short", aims_at=27, cell=26, old="true_value = L * p + score_mean",
         new="true_value = (L - 1) * p + score_mean", why="exact value summed over T tokens, not T + 1"),
    Slip(name="score-discounted-once-more", aims_at=27, cell=27, old="g ** (n_tok - 1 + extra) * score_mean",
         new="g ** (n_tok + extra) * score_mean",
         why="the score on token T discounted by gamma^(T+1): invisible at gamma = 1, caught at gamma < 1"),
    Slip(name="loss-without-half", aims_at=32, cell=32, old="sp.Rational(1, 2) * (v - g_i[i]) ** 2",
         new="(v - g_i[i]) ** 2",
         why="squared loss without the 1/2: the gradient is twice the residual"),
]
