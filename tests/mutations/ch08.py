"""Slips for chapter 8 (experiments II: bias and variance of the critic, the mean reward profile)."""
from mutations import Slip

CHAPTER = "08_bias_variance.ipynb"
# the code cells that prove each general proposition (the instance checks after them are not listed)
PROOFS = {
    "prop-bv-decomposition": (10,),
}
# the two sweeps over seeds and λ (about 100 s) and every cell that reads their results: paired intervals with
# margins that no slip aims at; nbval runs them
SKIP_CELLS = (*range(12, 21), *range(31, 38))
SKIP_WHY = "the λ sweeps without and with the KL term (about 100 s) and the cells that read them"
MUTATIONS = [
    # prop-bv-decomposition: the split and its expectations
    Slip(name="sample-variance-over-S", aims_at="prop-bv-decomposition", cell=10,
         old="{0: S, 1: P1, 2: P2}) / (S - 1)", new="{0: S, 1: P1, 2: P2}) / S",
         why="s^2 with 1/S: the biased sample variance, and the split no longer adds up"),
    Slip(name="bias-without-correction", aims_at="prop-bv-decomposition", cell=10,
         old="bias2_hat, var_hat = (xbar - v) ** 2 - s2 / S, s2", new="bias2_hat, var_hat = (xbar - v) ** 2, s2",
         why="the squared bias estimated by (mean - v)^2, without the -s^2/S correction"),
    Slip(name="runs-not-independent", aims_at="prop-bv-decomposition", cell=10,
         old="(2, 0): S * sigma2,", new="(2, 0): S**2 * sigma2,",
         why="E[(sum of deviations)^2] = S^2 sigma^2, as if the runs were one and the same"),
    # prop-bv-mean-profile (proved in the text; TD(0) symbolically, the recursion on a batch)
    Slip(name="td-profile-one-reward-too-many", aims_at=23, cell=23,
         old="a_td = lambda kk, tt: sp.Sum(rho[jj], (jj, tt, tt + kk - 1))",
         new="a_td = lambda kk, tt: sp.Sum(rho[jj], (jj, tt, tt + kk))",
         why="after k refreshes TD(0) credited with k + 1 mean rewards"),
    Slip(name="profile-weights-swapped", aims_at=25, cell=25,
         old="new[t] = rho_[t] + (1 - lam_) * a[t + 1] + lam_ * new[t + 1]",
         new="new[t] = rho_[t] + lam_ * a[t + 1] + (1 - lam_) * new[t + 1]",
         why="the mean-profile recursion with lambda on the old table and (1 - lambda) on the new one"),
    Slip(name="oracle-kl-reward-sign", aims_at=25, function="valuelab.lab.reference:kl_shaped_rewards",
         old="out.append(-beta * k)", new="out.append(beta * k)",
         why="the literal KL-shaped reward pays the KL instead of charging it"),
    Slip(name="lambda-return-gamma-dropped", aims_at=25, cell=25,
         old="vl.gae(one.rewards, one.values_exact, gamma=gam_, lam=0.9)",
         new="vl.gae(one.rewards, one.values_exact, lam=0.9)",
         why="the lambda-return computed without its gamma, against the literal at gamma = 0.9"),
    Slip(name="td-expectation-next-state", aims_at=25, cell=25,
         old="expected_v_next = np.r_[batch.values_exact.mean(0).cpu().numpy(), 0.0]",
         new="expected_v_next = np.r_[batch.values_exact.mean(0).cpu().numpy()[1:], 0.0, 0.0]",
         why="TD(0)'s error after k refreshes compared with E[V(s_{k+1})] instead of E[V(s_k)]"),
]
