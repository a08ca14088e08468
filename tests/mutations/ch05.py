"""Slips for chapter 5 (GAE: λ-weights, closed form, recursion, λ-return)."""
from mutations import Slip

CHAPTER = "05_gae.ipynb"
MUTATIONS = [
    # in the library functions the chapter's propositions rest on
    Slip(name="closed-limit-plus-1", function="valuelab.symbolic:gae_closed_form",
         old="(s.l, 0, T - t))", new="(s.l, 0, T - t + 1))",
         why="closed form summed one TD error past the last token (T read as the length)"),
    Slip(name="closed-limit-minus-1", function="valuelab.symbolic:gae_closed_form",
         old="(s.l, 0, T - t))", new="(s.l, 0, T - t - 1))",
         why="closed form stops one term early and drops delta_T, the score"),
    Slip(name="closed-dropped-lambda", function="valuelab.symbolic:gae_closed_form",
         old="(s.gamma * s.lam) ** s.l", new="s.gamma ** s.l",
         why="closed form discounts by gamma only, the lambda dropped"),
    Slip(name="weight-no-normaliser", function="valuelab.symbolic:lambda_weight",
         old="(1 - s.lam) * s.lam ** (n - 1)", new="s.lam ** (n - 1)",
         why="lambda-weight without the factor (1 - lambda)"),
    Slip(name="weight-power", function="valuelab.symbolic:lambda_weight",
         old="s.lam ** (n - 1)", new="s.lam ** n",
         why="lambda-weight lambda^n instead of lambda^(n-1)"),
    Slip(name="tail-weight-power", function="valuelab.symbolic:lambda_return_finite",
         old="s.lam ** (N - 1) * nstep_return", new="s.lam ** N * nstep_return",
         why="finite lambda-return with tail weight lambda^N instead of lambda^(N-1)"),
    Slip(name="recursion-sign", function="valuelab.symbolic:gae_recursion",
         old="_delta(j, delta) + s.gamma * s.lam * out", new="_delta(j, delta) - s.gamma * s.lam * out",
         why="backward recursion subtracts the discounted next advantage"),
    # in the chapter's own constructions
    Slip(name="head-window-from-0", cell=9, old="(n, 1, M_win)", new="(n, 0, M_win)",
         why="weight of the windows up to M summed from n = 0"),
    Slip(name="coef-range-off-by-one", cell=17, old="l_in, N_in = l, l + 1 + j", new="l_in, N_in = l, l + j",
         why="in-range case 0 <= l <= N - 1 taken as 0 <= l <= N"),
    Slip(name="coef-past-end-off-by-one", cell=17, old="l_out, N_out = N + j, N", new="l_out, N_out = N - 1 + j, N",
         why="out-of-range case l >= N taken as l >= N - 1"),
    Slip(name="induction-tail-power", cell=19, old="lam ** (N_ - 1) * sy.nstep_telescoped",
         new="lam ** N_ * sy.nstep_telescoped", why="mixture's tail weight lambda^N in the induction"),
    Slip(name="mc-without-bootstrap", cell=29, old="bootstrap=True", new="bootstrap=False",
         why="lambda = 1 compared with the Monte-Carlo advantage without gamma^N V(s_{T+1})"),
    Slip(name="chain-bias-exponent", cell=47, old="lam ** (L4 - 1)", new="lam ** L4",
         why="chain bias with lambda^L instead of lambda^(L-1)"),
]
