"""Slips for appendix A1 (errata of the source text)."""
from mutations import Slip

CHAPTER = "A1_errata.ipynb"
# the code cells that prove each general proposition (the instance checks after them are not listed)
PROOFS = {
    "prop-errata-window-gap": (9,),
}
MUTATIONS = [
    Slip(name="window-one-reward-too-many", aims_at="prop-errata-window-gap", cell=9,
         old="G_window = disc_sum(t, t + n - 1, t)", new="G_window = disc_sum(t, t + n, t)",
         why="the n-step window summed up to t + n: n + 1 rewards (prop-errata-window-gap)"),
    Slip(name="window-value-wrong-power", aims_at=11, cell=11,
         old="gamma ** (end - t_) * Vv(end)", new="gamma ** (end - t_ - 1) * Vv(end)",
         why="the critic's value at the window's end discounted by gamma^(n-1), not gamma^n (E1 average)"),
    Slip(name="score-on-every-token", aims_at=14, cell=14,
         old="return vl.kl_shaped_rewards(logp, ref_logp, score, beta=BETA)",
         new="return vl.kl_shaped_rewards(logp, ref_logp, 0.0, beta=BETA) + score",
         why="r_t = r_t^KL + score at every token: the missing t < T read the other way (E2, E3)"),
    Slip(name="next-value-not-shifted", aims_at=14, cell=14,
         old="torch.cat([v_first[1:], torch.zeros(1, dtype=torch.float64)])",
         new="torch.cat([v_first[:-1], torch.zeros(1, dtype=torch.float64)])",
         why="the TD residual written with V(s_{t-1}) for V(s_{t+1}): an off-by-one shift (E3)"),
    Slip(name="two-step-value-gamma-not-squared", aims_at=17, cell=17,
         old="two_step = disc_sum(t, t + 1, t) + gamma**2 * V[t + 2]",
         new="two_step = disc_sum(t, t + 1, t) + gamma * V[t + 2]",
         why="the two-step return bootstrapped with gamma V(s_{t+2}) instead of gamma^2 (E4)"),
    Slip(name="oracle-window-one-short", aims_at=19, function="valuelab.lab.reference:nstep_returns",
         old="end = min(t + n, L)", new="end = min(t + n - 1, L)",
         why="the oracle's n-step window stops one reward early (E4's numeric check)"),
    Slip(name="nstep-upper-limit-t-plus-n", aims_at=22, cell=22,
         old="(k, t_, t_ + n_ - 1)) + gamma**n_", new="(k, t_, t_ + n_)) + gamma**n_",
         why="the corrected n-step sum itself off by one at the upper end (E5)"),
    Slip(name="nstep-bootstrap-wrong-power", aims_at=22, cell=22,
         old="t_ + n_ - 1)) + gamma**n_ * V[t_ + n_]", new="t_ + n_ - 1)) + gamma**(n_ - 1) * V[t_ + n_]",
         why="the n-step bootstrap discounted by gamma^(n-1): the recursion alone cannot see it, the base case can (E5)"),
    Slip(name="my-nstep-drops-bootstrap", aims_at=26, cell=24,
         old="else torch.tensor(bootstrap, dtype=rewards.dtype)", new="else torch.tensor(0.0, dtype=rewards.dtype)",
         why="a window that reaches a cut forgets the bootstrap value (exercise, E9)"),
]
