"""Slips for chapter 9 (fast GAE: blocks, carries, affine maps, the λ-return recursion, compaction)."""
from mutations import Slip

CHAPTER = "09_fast_gae.ipynb"
# the code cells that prove each general proposition (the instance checks after them are not listed)
PROOFS = {
    "prop-fast-block": (8,),
    "prop-fast-assoc": (17,),
    "prop-fast-lambda-return": (21,),
}
# wall-clock measurements: the timing loop and GAE inside a PPO step (about 20 s); no slip aims at them
SKIP_CELLS = (51, 52, 58, 59)
SKIP_WHY = "the timings (about 20 s): wall-clock measurements, not checks of the algebra"
MUTATIONS = [
    # prop-fast-block
    Slip(name="block-tail-starts-late", aims_at="prop-fast-block", cell=8,
         old="tail = sp.Sum(c ** (j - (b + i)) * x[j], (j, b + C, n - 1))",
         new="tail = sp.Sum(c ** (j - (b + i)) * x[j], (j, b + C + 1, n - 1))",
         why="the tail after the block starts one token late: the next block's first input is lost"),
    Slip(name="block-local-power", aims_at="prop-fast-block", cell=8,
         old="local = sp.Sum(c ** (j - i) * x[b + j], (j, i, C - 1))",
         new="local = sp.Sum(c ** j * x[b + j], (j, i, C - 1))",
         why="the local solution discounted from the block's start, not from the token"),
    # prop-fast-assoc
    Slip(name="compose-wrong-decay", aims_at="prop-fast-assoc", cell=17,
         old="return (f[0] + f[1] * g[0], f[1] * g[1])", new="return (f[0] + g[1] * g[0], f[1] * g[1])",
         why="the composed map scales the inner offset by the inner decay instead of the outer one"),
    # prop-fast-lambda-return
    Slip(name="lambda-return-bootstrap-weight", aims_at="prop-fast-lambda-return", cell=21,
         old="A_t = (r_t + gam * V_next - V_t) + gam * lam * A_next",
         new="A_t = (r_t + gam * V_next - V_t) + lam * A_next",
         why="the GAE recursion without gamma on the next advantage"),
    Slip(name="lambda-return-claim-without-1-minus-lambda", aims_at="prop-fast-lambda-return", cell=21,
         old="(r_t + gam * (1 - lam) * V_next + gam * lam * G_next)) == 0",
         new="(r_t + gam * V_next + gam * lam * G_next)) == 0",
         why="the lambda-return recursion with V(s_{t+1}) weighted 1 instead of (1 - lambda)"),
    # the library's blocked scan against the loop
    Slip(name="carry-factor-one-short", aims_at=14, function="valuelab._engine.toeplitz:_build_toeplitz_factors",
         old="q = _powers(c, n - k)", new="q = _powers(c, n - k - 1)",
         why="the library's carry factor c^(C-i-1), one step short (the slip the chapter warns about)"),
    # compaction
    Slip(name="compaction-hole-not-identity", aims_at=25, cell=25,
         old="else y_h[t_ + 1]", new="else c * y_h[t_ + 1]",
         why="a hole discounted like a token (d = c) instead of carried over (d = 1)"),
]
