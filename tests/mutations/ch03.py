"""Slips for chapter 3 (token rewards with a KL penalty, the estimators k1, k2, k3)."""
from mutations import Slip

CHAPTER = "03_kl_rewards.ipynb"
# the code cells that prove each general proposition (the instance checks after them are not listed)
PROOFS = {
    "prop-kl-sum": (5, 7),
    "prop-kl-k3": (14, 16, 18),
}
MUTATIONS = [
    Slip(name="logratio-reversed", aims_at="prop-kl-sum", cell=5,
         old="rho_t = lambda j: sp.log(p_old[j]) - sp.log(p_ref[j])",
         new="rho_t = lambda j: sp.log(p_ref[j]) - sp.log(p_old[j])", why="rho_t as log pi_ref - log pi_old"),
    Slip(name="induction-step-off-by-one", aims_at="prop-kl-sum", cell=5, old="(S_T + rho_t(T + 1))",
         new="(S_T + rho_t(T))",
         why="the induction step adds the log-ratio of token T again, not of token T + 1"),
    Slip(name="first-token-penalty-dropped", aims_at="prop-kl-sum", cell=7,
         old="p_a * (sp.log(p_a) - sp.log(q_a) + cont(P_a[z] * R_a[z]))", new="p_a * cont(P_a[z] * R_a[z])",
         why="the depth step forgets the first token's own log-ratio"),
    Slip(name="joint-without-chain-rule", aims_at="prop-kl-sum", cell=7, old="sp.log(p_a * P_a[z] / (q_a * Q_a[z]))",
         new="sp.log(P_a[z] / Q_a[z])", why="the response's probability taken as the continuation's only"),
    Slip(name="tree-kl-weighted-by-ref", aims_at=9, cell=9, old="kl_seq = sum(seq_old[y] * sp.log(",
         new="kl_seq = sum(seq_ref[y] * sp.log(",
         why="the sequence KL averaged under pi_ref instead of pi_old"),
    Slip(name="reference-not-normalised", aims_at="prop-kl-k3", cell=14,
         old="normalised_n = {vocab(pi_o[i]): 1, vocab(pi_r[i]): 1}",
         new="normalised_n = {vocab(pi_o[i]): 1}", why="the support condition sum pi_ref = 1 forgotten"),
    Slip(name="k3-exp-sign", aims_at="prop-kl-k3", cell=14, old="E_k3 = vocab(pi_o[i] * (sp.exp(-rho_i) - 1 + rho_i))",
         new="E_k3 = vocab(pi_o[i] * (sp.exp(rho_i) - 1 + rho_i))", why="k3 with e^{+rho}"),
    Slip(name="remainder-weight", aims_at="prop-kl-k3", cell=16, old="integrand = (1 - u) * sp.exp(-u * r_)",
         new="integrand = u * sp.exp(-u * r_)", why="Taylor remainder with weight u instead of (1 - u)"),
    Slip(name="library-k3-minus", aims_at=16, function="valuelab.rewards:kl_penalty", old="k = torch.expm1(-rho) + rho",
         new="k = torch.expm1(-rho) - rho", why="the library's k3 subtracts rho: negative, and biased"),
    Slip(name="library-k3-reversed", aims_at=21, function="valuelab.rewards:kl_penalty",
         old="k = torch.expm1(-rho) + rho",
         new="k = torch.expm1(rho) - rho", why="the library's k3 for the reversed ratio: still >= 0, but biased"),
    Slip(name="k2-without-half", aims_at="prop-kl-k3", cell=18, old='"k2": rho_h**2 / 2', new='"k2": rho_h**2',
         why="k2 = rho^2 without the 1/2"),
    Slip(name="perturbation-sign", aims_at="prop-kl-k3", cell=18, old="rho_h = -sp.log(1 + eps * hs)",
         new="rho_h = sp.log(1 + eps * hs)",
         why="rho = log(pi_ref / pi_old): the log-ratio flipped in the expansion"),
    Slip(name="leak-D-discount", aims_at=31, cell=31, old="(1 - GAMMA * LAM) * sc[0]", new="(1 - GAMMA) * sc[0]",
         why="the score's lost share without lambda"),
]
