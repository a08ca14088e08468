"""Slips for chapter 11 (implementation details that bite)."""
from mutations import Slip

CHAPTER = "11_pitfalls.ipynb"
MUTATIONS = [
    Slip(name="leak-without-1-minus-lambda", cell=10, old="g * ((1 - lam) * w[jj + shift]",
         new="g * (w[jj + shift]", why="the padding value leaks in whole, without its factor (1 - lambda)"),
    Slip(name="leak-power-off-by-one", cell=10, old="(g * lam) ** (jj - 1) * g", new="(g * lam) ** jj * g",
         why="the j-th slot discounted by (gamma lambda)^j instead of (gamma lambda)^(j-1)"),
    Slip(name="carry-tail-power", cell=10, old="(j, 1, n)) + (g * lam) ** n * C0", new="(j, 1, n)) + (g * lam) ** (n - 1) * C0",
         why="the correct carry comes back through one slot too few"),
    Slip(name="batch-leak-without-1-minus-lambda", cell=14, old="GAMMA * (1 - lam_b) * pads[jj - 1]",
         new="GAMMA * pads[jj - 1]", why="the predicted leak of the naive loop without (1 - lambda)"),
    Slip(name="padded-variance-over-N", cell=24, old="naive_var = (S2 - N * naive_mean**2) / (N - 1)",
         new="naive_var = (S2 - N * naive_mean**2) / N", why="the unbiased variance of the padded tensor with 1/N"),
    Slip(name="mixed-variance-over-N", cell=24, old="mixed_var = (S2 - 2 * naive_mean * S1 + n * naive_mean**2) / n",
         new="mixed_var = (S2 - 2 * naive_mean * S1 + n * naive_mean**2) / N",
         why="SkyRL's masked variance divided by all N entries instead of the n valid ones"),
    Slip(name="mixed-shift-not-squared", cell=26, old="+ f**2 * mu_v.item() ** 2", new="+ f * mu_v.item() ** 2",
         why="the squared shift of the centre taken as f mu^2, not (f mu)^2"),
    Slip(name="truncation-power-off-by-one", cell=37, old="D = lambda s: g * (g * lam) ** (TT - s) * bb",
         new="D = lambda s: g * (g * lam) ** (TT - s + 1) * bb", why="the bootstrap decays once more than it should"),
    Slip(name="gae-without-last-td-error", function="valuelab.symbolic:gae_closed_form", old="(s.l, 0, T - t))",
         new="(s.l, 0, T - t - 1))", why="GAE summed without delta_T, the one TD error that holds the bootstrap"),
    Slip(name="truncation-prediction-power", cell=39, old="(GAMMA * lam5) ** (L_CUT - 1 - t) * b_cut",
         new="(GAMMA * lam5) ** (L_CUT - t) * b_cut", why="the predicted bias counts the response length, not the last index"),
    Slip(name="bootstrap-every-cut", cell=42, old="bootstrap = torch.where(scored, torch.zeros_like(v_cut), v_cut)",
         new="bootstrap = torch.where(ended, torch.zeros_like(v_cut), v_cut)",
         why="the scored cut bootstrapped as well: its continuation counted on top of its score"),
    Slip(name="k3-ratio-inverted", cell=47, old="k1_, k3_ = rho_, q_[a] / p_[a] - 1 + rho_",
         new="k1_, k3_ = rho_, p_[a] / q_[a] - 1 + rho_", why="k3 with p/q instead of q/p"),
    Slip(name="k3-loss-sign", cell=47, old="sp.exp(sp.log(q_[a]) - x_lp)", new="sp.exp(x_lp - sp.log(q_[a]))",
         why="k3 differentiated with the ratio p/q: the loss gradient of the wrong KL"),
]
