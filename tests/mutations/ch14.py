"""Slips for chapter 14 (valuelab in a trainer: holes, TRL's phantom step, packed batches, whitening)."""
from mutations import Slip

CHAPTER = "14_trainers.ipynb"
PROOFS: dict = {}  # no proposition in this chapter
# verl's launcher under Ray (about 25 s): its check runs in Ray's worker processes, which import valuelab afresh,
# so no slip planted in this process reaches it (tests/test_trainer_processes.py runs the same launcher)
# The data-parallel statistics (cells 18 and 19, about 5 s) run in spawned gloo processes; no slip aims at them
# (tests/test_distributed.py tests them).
SKIP_CELLS = (7, 19, 20)
SKIP_WHY = "verl under Ray and the gloo processes (about 30 s): their checks run in processes no slip reaches"
# each library slip is planted just before the cell that first calls its function (from_cell): the trainers'
# packages the earlier cells import (OpenRLHF, TorchRL, TRL) are not imported again for each slip
MUTATIONS = [
    Slip(name="openrlhf-holes-skipped", aims_at=10, function="valuelab.integrations.openrlhf:advantages_and_returns",
         from_cell=10,
         old="adv = gae(rewards, values, gamma=g, lam=l_).advantages",
         new="adv = gae(rewards, values, mask=m, gamma=g, lam=l_).advantages",
         why="the hole convention swapped: OpenRLHF's drop-in skips holes instead of zeroing them"),
    Slip(name="trl-without-phantom", aims_at=15, function="valuelab.integrations.trl:from_trl", from_cell=15,
         old="end = torch.where(n + 1 < T, n + 1, n)", new="end = n",
         why="TRL's score read on the EOS token, not on the phantom step after it"),
    Slip(name="packed-bootstrap-on-ended", aims_at=17, function="valuelab.packed:_bootstrap", from_cell=17,
         old="return torch.where(truncated.to(like.device), bootstrap.to(like.dtype), zero)",
         new="return torch.where(truncated.to(like.device), zero, bootstrap.to(like.dtype))",
         why="the packed scan bootstraps the sequences that ended and not those that were cut"),
    Slip(name="verl-whitening-biased-variance", aims_at=23, function="valuelab.losses:_whiten_everywhere", from_cell=23,
         old="var = (centred * centred).sum() / (count - 1)", new="var = (centred * centred).sum() / count",
         why="verl's whitening (unbiased=True, the default) with the biased variance, OpenRLHF's"),
]
