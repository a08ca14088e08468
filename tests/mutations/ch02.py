"""Slips for chapter 2 (TD targets, semi-gradient and residual gradient, frozen and live targets)."""
from mutations import Slip

CHAPTER = "02_td_targets.ipynb"
# the code cells that prove each general proposition (the instance checks after them are not listed)
PROOFS = {
    "prop-td-semigradient": (23, 25),
    "prop-td-refreshes": (53,),
}
MUTATIONS = [
    # the TD expansion (prop-td-expansion)
    Slip(name="inner-sum-from-t+2", aims_at=8, cell=6, old="(k, t + 1, T))  # the inner sum",
         new="(k, t + 2, T))  # the inner sum",
         why="off-by-one lower limit of the inner sum of eq-td-split"),
    Slip(name="inner-sum-power", aims_at=8, cell=6, old="inner = sp.Sum(gamma ** (k - (t + 1))",
         new="inner = sp.Sum(gamma ** (k - t)",
         why="inner sum discounted from t instead of t+1 (one gamma too many)"),
    Slip(name="path-prob-wrong-prefix", aims_at=16, cell=14, old="pi(a, s + cont[:i])", new="pi(a, s)",
         why="every token of a path drawn from the policy at the starting prefix"),
    Slip(name="path-return-power", aims_at=16, cell=14, old="gamma**i * r_sym", new="gamma**(i + 1) * r_sym",
         why="return discounted from one step too late"),
    # semi-gradient and residual gradient (prop-td-semigradient)
    Slip(name="residual-drops-gamma", aims_at="prop-td-semigradient", cell=23, old="e = V_now - r_t - gamma * V_next",
         new="e = V_now - r_t - V_next",
         why="residual without the discount on the next value"),
    Slip(name="variance-unweighted-mean", aims_at="prop-td-semigradient", cell=25,
         old="y_mean = sp.Sum(q[j] * y_out[j], (j, 1, K))",
         new="y_mean = sp.Sum(y_out[j], (j, 1, K)) / K", why="variance around the unweighted mean of the targets"),
    Slip(name="w2w-semi-not-detached", aims_at=27, cell=27, old="2 * w.detach() if semi else 2 * w",
         new="2 * w if semi else 2 * w",
         why="the semi-gradient run lets the gradient through the target"),
    Slip(name="two-state-drops-gamma", aims_at=30, cell=30, old="(vA - gamma * vB) ** 2       # A --> B",
         new="(vA - vB) ** 2       # A --> B", why="residual loss at A without the discount on V(B)"),
    Slip(name="two-state-target-drops-gamma", aims_at=32, cell=32, old="branches = [(1 - p, 0), (p, gamma * vB)]",
         new="branches = [(1 - p, 0), (p, vB)]", why="target at A without the discount"),
    # the experiments
    Slip(name="residual-squares-the-mean", aims_at=40, cell=40, old="loss = 0.5 * vl.masked_mean(delta**2, batch.mask)",
         new="loss = 0.5 * vl.masked_mean(delta, batch.mask) ** 2", why="(E delta)^2 for E[delta^2]"),
    Slip(name="frozen-rebuilt-every-step", aims_at=48, cell=48, old='(("live", 1), ("frozen", K))',
         new='(("live", 1), ("frozen", 1))',
         why="the frozen arm rebuilds its target every step: it is live"),
    # one token per refresh (prop-td-refreshes)
    Slip(name="refresh-condition-off-by-one", aims_at="prop-td-refreshes", cell=53, old="t_ >= T + 1 - k_",
         new="t_ >= T - k_",
         why="claimed critic one token ahead of the truth"),
    # the library's TD target
    Slip(name="td-target-no-gamma", aims_at=55, function="valuelab.returns:td_targets",
         old="c.rewards + c.gamma * shift_next",
         new="c.rewards + shift_next", why="TD target without the discount"),
    Slip(name="td-target-no-bootstrap", aims_at=59, function="valuelab.returns:td_targets",
         old="shift_next(c.values, c.packed.valid, c.bootstrap)",
         new="shift_next(c.values, c.packed.valid, 0 * c.bootstrap)",
         why="delta_T without the bootstrap term of a truncated response"),
]
