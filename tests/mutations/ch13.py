"""Slips for chapter 13 (a transformer critic started from the reward model; which position is V(s_t))."""
from mutations import Slip

CHAPTER = "13_transformer_critic.ipynb"
# no general proposition here; the off-by-one is proved in the text and checked numerically in cells 11 and 12
PROOFS = {
    "prop-off-by-one": (12, 13),
}
# the clip grid and the propagation runs (about 15 s) and the verdicts read from them: statistical margins that no
# slip aims at; nbval runs them.
SKIP_CELLS = tuple(range(15, 39))
SKIP_WHY = "the RM-start bias plot, the clip grid, the propagation runs (about 15 s) and the verdicts read from them"
# the library slips are planted just before cell 11, the first to call advantage_fit and to read the exact
# advantages: the reward model (cell 8, about 10 s) is not trained again for each of them
MUTATIONS = [
    # the chapter's own pair of critics: the trained off-by-one transformer
    Slip(name="shifted-critic-aligned", aims_at="prop-off-by-one", cell=13,
         old="heads[SHIFTED, :, 1:]", new="heads[SHIFTED, :, :-1]",
         why="the 'off-by-one' critics of the experiment read position t: there is nothing left to compare"),
    # kappa (valuelab.lab.ppo.advantage_fit) with the exact V and the exact Q as critics
    Slip(name="kappa-reversed-regression", aims_at="prop-off-by-one", function="valuelab.lab.ppo:advantage_fit",
         from_cell=12,
         old="kappa = float((dA * (a - a.mean())).sum()) / ss",
         new="kappa = float((dA * (a - a.mean())).sum()) / float(((a - a.mean()) ** 2).sum())",
         why="kappa as the slope of the exact advantage on the estimate (the regression reversed)"),
    Slip(name="exact-advantage-without-next-value", aims_at="prop-off-by-one",
         function="valuelab.lab.policy:sample_responses", from_cell=12,
         old="advantages_exact = td_errors(rewards, values_exact, mask=mask, gamma=world.gamma)",
         new="advantages_exact = rewards - values_exact",
         why="the exact advantage r_t - V(s_t), without gamma V(s_{t+1})"),
    # the library's alignment (valuelab.lab.transformer.state_values), checked in cell 11 by changing one action
    Slip(name="state-values-read-t-plus-1", aims_at=12, function="valuelab.lab.transformer:state_values",
         from_cell=12, old="return model(model.check_inputs(inputs))[..., :-1]",
         new="return model(model.check_inputs(inputs))[..., 1:]",
         why="V(s_t) read at position t + 1, which has already read a_t (the off-by-one of the chapter)"),
    # the value-clip exercise
    Slip(name="exercise-clip-forgotten", aims_at=44, cell=44,
         old="vl.value_loss(values, target, old_values=old, clip_range=0.2)",
         new="vl.value_loss(values, target, old_values=old)",
         why="the clipped value loss called without its clip range: every value gets a gradient"),
]
