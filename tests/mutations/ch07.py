"""Slips for chapter 7 (experiments I: how far the score travels per refresh, and the noise of the targets)."""
from mutations import Slip

CHAPTER = "07_propagation.ipynb"
# the code cells that prove each general proposition (the instance checks after them are not listed)
PROOFS = {
    "prop-exp-propagation": (16, 18, 22),
}
# the GRU critic (cell 31, about two minutes) and the cells that read its runs: measurements with statistical
# margins that no slip aims at (and the glue cell 45, which formats with a helper of cell 36); nbval runs them
SKIP_CELLS = (31, 32, 33, 34, 36, 37, 45)
SKIP_WHY = "the neural-critic experiment (about two minutes) and the cells that read it"
MUTATIONS = [
    # prop-exp-propagation: the target recursion, the binomial law, the refresh counts
    Slip(name="lambda-return-without-1-minus-lambda", aims_at="prop-exp-propagation", cell=16,
         old="(r_t + gam * ((1 - lam) * V_next + lam * G_next))", new="(r_t + gam * (V_next + lam * G_next))",
         why="the lambda-return recursion with the bootstrap weight 1 instead of (1 - lambda)"),
    Slip(name="law-one-term-too-many", aims_at="prop-exp-propagation", cell=18,
         old="lam ** (dd - 1 - i), (i, 0, kk - 1))", new="lam ** (dd - 1 - i), (i, 0, kk))",
         why="the binomial tail c_k(d) summed up to i = k: one jump more than k refreshes make"),
    Slip(name="pascal-without-shift", aims_at="prop-exp-propagation", cell=18,
         old="f_b = sp.binomial(d - 1, i - 1)", new="f_b = sp.binomial(d - 1, i)",
         why="the second sum's terms without their index shift: Pascal's rule no longer closes the step"),
    Slip(name="refresh-count-one-late", aims_at="prop-exp-propagation", cell=22,
         old="return dd - kk * step", new="return dd - (kk + 1) * step",
         why="the slack counts one refresh too many: ceil(L / n) - 1 refreshes would do"),
    # the library's targets against the literal transcriptions
    Slip(name="target-is-the-advantage", aims_at=13, function="valuelab.critic:critic_targets",
         old="gamma=gamma, lam=lam).returns", new="gamma=gamma, lam=lam).advantages",
         why="the critic regressed on the GAE advantage instead of the lambda-return"),
    # the sampled batch against the law
    Slip(name="law-fraction-swapped-binomial", aims_at=24, cell=24,
         old="(1 - lam_) ** j * lam_ ** (d_ - 1 - j)", new="lam_ ** j * (1 - lam_) ** (d_ - 1 - j)",
         why="the numeric law with Bin(d - 1, lambda) for Bin(d - 1, 1 - lambda)"),
]
