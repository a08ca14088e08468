"""Slips for chapter 7 (experiments I: how far the score travels per refresh, and the noise of the targets)."""
from mutations import Slip

CHAPTER = "07_propagation.ipynb"
# the code cells that prove each general proposition (the instance checks after them are not listed)
PROOFS = {
    "prop-exp-propagation": (17, 19, 23),
}
# the GRU critic (cell 31, about two minutes) and the cells that read its runs: measurements with statistical
# margins that no slip aims at (and the glue cell 45, which formats with a helper of cell 36); nbval runs them
SKIP_CELLS = (32, 33, 34, 35, 37, 38, 46)
SKIP_WHY = "the neural-critic experiment (about two minutes) and the cells that read it"
MUTATIONS = [
    # prop-exp-propagation: the target recursion, the binomial law, the refresh counts
    Slip(name="lambda-return-without-1-minus-lambda", aims_at="prop-exp-propagation", cell=17,
         old="(r_t + gam * ((1 - lam) * V_next + lam * G_next))", new="(r_t + gam * (V_next + lam * G_next))",
         why="the lambda-return recursion with the bootstrap weight 1 instead of (1 - lambda)"),
    Slip(name="law-one-term-too-many", aims_at="prop-exp-propagation", cell=19,
         old="lam ** (dd - 1 - i), (i, 0, kk - 1))", new="lam ** (dd - 1 - i), (i, 0, kk))",
         why="the binomial tail c_k(d) summed up to i = k: one jump more than k refreshes make"),
    Slip(name="pascal-without-shift", aims_at="prop-exp-propagation", cell=19,
         old="f_b = sp.binomial(d - 1, i - 1)", new="f_b = sp.binomial(d - 1, i)",
         why="the second sum's terms without their index shift: Pascal's rule no longer closes the step"),
    Slip(name="refresh-count-one-late", aims_at="prop-exp-propagation", cell=23,
         old="return dd - kk * step", new="return dd - (kk + 1) * step",
         why="the slack counts one refresh too many: ceil(L / n) - 1 refreshes would do"),
    # the library's targets against the literal transcriptions
    Slip(name="target-is-the-advantage", aims_at=14, function="valuelab.lab.critic:critic_targets",
         old="gamma=gamma, lam=lam).returns", new="gamma=gamma, lam=lam).advantages",
         why="the critic regressed on the GAE advantage instead of the lambda-return"),
    # the sampled batch against the law
    Slip(name="law-fraction-swapped-binomial", aims_at=25, cell=25,
         old="(1 - lam_) ** j * lam_ ** (d_ - 1 - j)", new="lam_ ** j * (1 - lam_) ** (d_ - 1 - j)",
         why="the numeric law with Bin(d - 1, lambda) for Bin(d - 1, 1 - lambda)"),
    Slip(name="law-at-gamma-uses-gamma-lambda", aims_at=25, cell=25,
         old="law_gap_disc = law_miss(v_disc, lambda kk: law_fraction(kk, L, 0.8))",
         new="law_gap_disc = law_miss(v_disc, lambda kk: law_fraction(kk, L, world_disc.gamma * 0.8))",
         why="the law at gamma = 0.9 with GAE's gamma * lambda for lambda"),
    # the checks at gamma < 1 and the variance prediction
    Slip(name="mc-check-gamma-dropped", aims_at=11, cell=11,
         old="mask=big_g.mask, gamma=world_g.gamma)", new="mask=big_g.mask)",
         why="the sampled returns of the discounted world summed without their gamma"),
    Slip(name="variance-weights-not-squared", aims_at=45, cell=43,
         old="lambda l: 0.9 ** (2 * l)", new="lambda l: 0.9 ** l",
         why="eq-target-variance for GAE(0.9) with weights lambda^l instead of lambda^(2l)"),
    Slip(name="variance-gamma-not-squared", aims_at=45, cell=45,
         old="predict(lambda l: (gam_d * lam_) ** (2 * l), delta_sq_g)",
         new="predict(lambda l: gam_d**l * lam_ ** (2 * l), delta_sq_g)",
         why="eq-target-variance at gamma = 0.9 with the square on lambda only"),
]
