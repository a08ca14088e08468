"""valuelab inside production trainers: drop-in functions with each trainer's signature and conventions.

* :mod:`valuelab.integrations.verl`: verl's ``compute_gae_advantage_return``
  (holes skipped and their advantages carried, advantages whitened inside),
  installed in one process or in every Ray worker;
* :mod:`valuelab.integrations.openrlhf`: OpenRLHF's
  ``get_advantages_and_returns`` (holes zeroed, not skipped), bound onto its
  experience maker in one process or in every Ray worker;
* :mod:`valuelab.integrations.torchrl`: TorchRL's functional GAE with its
  exact semantics (any number of trajectories per row, ``done`` and
  ``terminated``), and TorchRL's layout to valuelab's and back;
* :mod:`valuelab.integrations.trl`: TRL's PPO tensors (the score one step
  past EOS) in valuelab's layout, with or without that phantom step.

The two trainers treat a *hole* (a masked position inside a response, such
as a tool's output) differently; :func:`hole_convention` says how, and
:func:`valuelab.gae` implements the first by default. Each module's tests
run the trainer's own code, from its PyPI package, on the same batches; the
verl and OpenRLHF swaps are tested inside real Ray workers.
"""

from . import openrlhf, torchrl, trl, verl
from ._conventions import HOLE_CONVENTIONS, carry_into_holes, hole_convention, zero_holes

__all__ = ["verl", "openrlhf", "torchrl", "trl", "HOLE_CONVENTIONS", "hole_convention", "carry_into_holes", "zero_holes"]
