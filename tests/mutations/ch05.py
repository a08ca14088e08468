"""Slips for chapter 5 (GAE: λ-weights, closed form, recursion, λ-return)."""
from mutations import Slip

CHAPTER = "05_gae.ipynb"
# the code cells that prove each general proposition (the instance checks after them are not listed)
PROOFS = {
    "prop-gae-closed": (16, 18, 20),
    "prop-gae-recursion": (34,),
    "prop-lambda-return": (38,),
}
MUTATIONS = [
    # in the library functions the chapter's propositions rest on
    Slip(name="closed-limit-plus-1", aims_at="prop-gae-closed", function="valuelab.lab.symbolic:gae_closed_form",
         old="(s.l, 0, T - t))", new="(s.l, 0, T - t + 1))",
         why="closed form summed one TD error past the last token (T read as the length)"),
    Slip(name="closed-limit-minus-1", aims_at="prop-gae-closed", function="valuelab.lab.symbolic:gae_closed_form",
         old="(s.l, 0, T - t))", new="(s.l, 0, T - t - 1))",
         why="closed form stops one term early and drops delta_T, the score"),
    Slip(name="closed-dropped-lambda", aims_at="prop-gae-closed", function="valuelab.lab.symbolic:gae_closed_form",
         old="(s.gamma * s.lam) ** s.l", new="s.gamma ** s.l",
         why="closed form discounts by gamma only, the lambda dropped"),
    Slip(name="weight-no-normaliser", aims_at=8, function="valuelab.lab.symbolic:lambda_weight",
         old="(1 - s.lam) * s.lam ** (n - 1)", new="s.lam ** (n - 1)",
         why="lambda-weight without the factor (1 - lambda)"),
    Slip(name="weight-power", aims_at=8, function="valuelab.lab.symbolic:lambda_weight",
         old="s.lam ** (n - 1)", new="s.lam ** n",
         why="lambda-weight lambda^n instead of lambda^(n-1)"),
    Slip(name="tail-weight-power", aims_at=12, function="valuelab.lab.symbolic:lambda_return_finite",
         old="s.lam ** (N - 1) * nstep_return", new="s.lam ** N * nstep_return",
         why="finite lambda-return with tail weight lambda^N instead of lambda^(N-1)"),
    Slip(name="recursion-sign", aims_at=36, function="valuelab.lab.symbolic:gae_recursion",
         old="_delta(j, delta) + s.gamma * s.lam * out", new="_delta(j, delta) - s.gamma * s.lam * out",
         why="backward recursion subtracts the discounted next advantage"),
    # in the chapter's own constructions
    Slip(name="head-window-from-0", aims_at=10, cell=10, old="(n, 1, M_win)", new="(n, 0, M_win)",
         why="weight of the windows up to M summed from n = 0"),
    Slip(name="coef-range-off-by-one", aims_at="prop-gae-closed", cell=18, old="l_in, N_in = l, l + 1 + j",
         new="l_in, N_in = l, l + j",
         why="in-range case 0 <= l <= N - 1 taken as 0 <= l <= N"),
    Slip(name="coef-past-end-off-by-one", aims_at="prop-gae-closed", cell=18, old="l_out, N_out = N + j, N",
         new="l_out, N_out = N - 1 + j, N",
         why="out-of-range case l >= N taken as l >= N - 1"),
    Slip(name="induction-tail-power", aims_at="prop-gae-closed", cell=20, old="lam ** (N_ - 1) * sy.nstep_telescoped",
         new="lam ** N_ * sy.nstep_telescoped", why="mixture's tail weight lambda^N in the induction"),
    Slip(name="recursion-shift-one-term-too-many", aims_at="prop-gae-recursion", cell=34,
         old="delta[t + l + 1], (l, 0, T - t - 1))", new="delta[t + l + 1], (l, 0, T - t))",
         why="the shifted terms l' = 0..T-t: one TD error past the last token in the induction step"),
    Slip(name="lambda-return-tail-power", aims_at="prop-lambda-return", cell=38,
         old="lam ** (N - 1) * Gn[N]", new="lam ** N * Gn[N]",
         why="the mixture of returns with tail weight lambda^N: its weights no longer sum to one"),
    Slip(name="mc-without-bootstrap", aims_at=30, cell=30, old="bootstrap=True", new="bootstrap=False",
         why="lambda = 1 compared with the Monte-Carlo advantage without gamma^N V(s_{T+1})"),
    Slip(name="chain-bias-exponent", aims_at=48, cell=48, old="lam ** (L4 - 1)", new="lam ** L4",
         why="chain bias with lambda^L instead of lambda^(L-1)"),
    Slip(name="chain-theory-exponent-L", aims_at=51, cell=50, old="1 - ETA * (1 - lm ** (L - 1))",
         new="1 - ETA * (1 - lm ** L)",
         why="the measured chain held to lambda^L: inside the 4-s.e. band, outside the paired check's"),
]
