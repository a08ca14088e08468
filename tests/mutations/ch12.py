"""Slips for chapter 12 (experiments III: the critic inside PPO, the soft optimum, κ)."""
from mutations import Slip

CHAPTER = "12_critic_in_ppo.ipynb"
# no general proposition here; the soft optimum is proved in the text and checked numerically in cell 10
PROOFS = {
    "prop-soft-optimum": (11,),
}
# the PPO sweeps (the arms on ten seeds, the replica worlds, the post-hoc arm: about 80 s) and every cell that
# reads their histories: verdicts with statistical margins that no slip aims at; nbval runs them. The exercise
# checks after them need none of it and run.
SKIP_CELLS = tuple(range(13, 52))
SKIP_WHY = "the PPO sweeps (about 80 s) and the cells that read their histories"
MUTATIONS = [
    # the soft optimum (valuelab.lab.policy.soft_optimal) against enumeration
    Slip(name="soft-beta-only-outside-the-log", aims_at="prop-soft-optimum", function="valuelab.lab.policy:soft_optimal",
         old="z = log_ref + q_t[:, None] / world.beta", new="z = log_ref + q_t[:, None]",
         why="V* = beta log sum pi_ref e^{Q}: beta outside the log, but Q not divided by it inside"),
    Slip(name="soft-q-times-beta", aims_at="prop-soft-optimum", function="valuelab.lab.policy:soft_optimal",
         old="z = log_ref + q_t[:, None] / world.beta", new="z = log_ref + q_t[:, None] * world.beta",
         why="the soft max of Q * beta instead of Q / beta"),
    Slip(name="soft-optimum-prior-uniform", aims_at="prop-soft-optimum", function="valuelab.lab.policy:soft_optimal",
         old="log_ref = np.log(world.pi_ref)[:, :, None, :]",
         new="log_ref = np.zeros_like(world.pi_ref)[:, :, None, :]",
         why="the soft optimum tilts a uniform policy instead of pi_ref"),
    # the exact DP of a policy that is not the reference (pi*): its KL term must count
    Slip(name="dp-kl-against-the-policy-itself", aims_at="prop-soft-optimum", function="valuelab.lab.policy:_log_ratio",
         old="log_pi - log_ref, 0.0)", new="log_pi - log_pi, 0.0)",
         why="the DP's KL term against the evaluated policy itself (pi_old for pi_ref): always 0"),
    Slip(name="dp-kl-paid-not-charged", aims_at="prop-soft-optimum", function="valuelab.lab.policy:evaluate_policy",
         old="values, q = _backward(world, probs, -world.beta * rho,",
         new="values, q = _backward(world, probs, world.beta * rho,",
         why="the DP adds the KL term to the reward instead of subtracting it"),
    # the DP against sampling (on pi_ref, and on pi*)
    Slip(name="sampled-ref-logprob-wrong-context", aims_at=9, function="valuelab.lab.policy:sample_responses",
         old="log_ref[prompt[:, None], contexts, tokens]", new="log_ref[prompt[:, None], tokens, tokens]",
         why="the sampler reads pi_ref(a | a) for pi_ref(a | c): the token taken for its own context"),
    # the DP against sampling on pi*, where the sampled KL penalty is not zero
    Slip(name="sampled-kl-against-pi-old", aims_at=9, function="valuelab.lab.policy:sample_responses",
         old="rewards = kl_shaped_rewards(logprobs, ref_logprobs, score, mask=mask, beta=world.beta)",
         new="rewards = kl_shaped_rewards(logprobs, logprobs, score, mask=mask, beta=world.beta)",
         why="the sampled rewards' KL taken against the sampling policy itself (pi_old for pi_ref): no penalty"),
    Slip(name="sampled-kl-sign", aims_at=9, function="valuelab.lab.policy:sample_responses",
         old="rewards = kl_shaped_rewards(logprobs, ref_logprobs, score, mask=mask, beta=world.beta)",
         new="rewards = kl_shaped_rewards(ref_logprobs, logprobs, score, mask=mask, beta=world.beta)",
         why="the sampled KL penalty with its sign flipped (log-ratio reversed)"),
    # kappa (valuelab.lab.ppo.advantage_fit), the exercise's check
    Slip(name="kappa-reversed-regression", aims_at=55, function="valuelab.lab.ppo:advantage_fit",
         old="kappa = float((dA * (a - a.mean())).sum()) / ss",
         new="kappa = float((dA * (a - a.mean())).sum()) / float(((a - a.mean()) ** 2).sum())",
         why="kappa as the slope of the exact advantage on the estimate (the regression reversed)"),
]
