"""The tests of ``valuelab.lab.ppo`` must catch eight plausible slips in the PPO loop (the issue's list).

Each slip is one textual change to ``valuelab/lab/ppo.py``. It is planted in a
fresh copy of the module, built from the edited source under a private name
(the installed module and the files on disk are untouched), and the check of
``tests/test_ppo.py`` named beside it must then fail with an
``AssertionError``: the one-iteration comparison with the loop written from
the PPO equations, or the check of the documented defaults. The unedited
source, built the same way, must pass the same checks, so a failure is the
slip's doing.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import valuelab.lab.ppo  # noqa: E402
from test_ppo import HAND_CASES, check_defaults, check_one_iteration  # noqa: E402

CASES = {c[0]: c for c in HAND_CASES}

# (name, old text, new text, the check that must catch it)
SLIPS = [
    ("lambdas-swapped",
     "lam_actor=lam_actor,\n                                lam_critic=arm.lam_critic)",
     "lam_actor=arm.lam_critic,\n                                lam_critic=lam_actor)", "rm"),
    ("value-clip-off", "fit(batch, adv, targets, v_old, config.value_clip)", "fit(batch, adv, targets, v_old, None)", "rm"),
    ("whitening-off", "        if config.whiten:\n", "        if False:\n", "rm"),
    ("ratio-clip-100", "mask=_per_run(m, R), clip_range=config.clip_range,", "mask=_per_run(m, R), clip_range=100,", "rm"),
    ("rm-start-zero", "torch.as_tensor(reward_model_start(world).reshape(-1))", "torch.zeros(S)", "rm"),
    ("group-std-removed", "group_advantages(total, batch.group)[:, None]",
     "group_advantages(total, batch.group, normalise=False)[:, None]", "group-raw"),
    ("kappa-after-whitening", "advantage_fit(raw[rows],", "advantage_fit(adv[rows],", "rm"),
    ("one-epoch", "for _ in range(config.epochs):", "for _ in range(1):", "rm"),
    # the same slips made in PPOConfig's defaults instead of the loop
    ("default-one-epoch", "epochs: int = 2", "epochs: int = 1", "defaults"),
    ("default-ratio-clip-100", "clip_range: float = 0.2\n    value_clip", "clip_range: float = 100.0\n    value_clip",
     "defaults"),
    ("default-value-clip-off", "value_clip: Optional[float] = 0.2", "value_clip: Optional[float] = None", "defaults"),
    ("default-whitening-off", "whiten: bool = True", "whiten: bool = False", "defaults"),
]


def planted(old: str, new: str, tag: str):
    """valuelab.lab.ppo built from its source with ``old`` replaced (exactly once) by ``new``."""
    source = Path(valuelab.lab.ppo.__file__).read_text(encoding="utf-8")
    assert source.count(old) == 1, f"{tag}: the slip's text occurs {source.count(old)} times in ppo.py, not once"
    name = f"valuelab.lab._ppo_slip_{tag.replace('-', '_')}"
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "valuelab.lab"
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    try:
        exec(compile(source.replace(old, new), f"<ppo.py with {tag}>", "exec"), module.__dict__)
    finally:
        del sys.modules[name]
    return module


def run_check(module, check: str) -> None:
    if check == "defaults":
        check_defaults(module)
    else:
        check_one_iteration(module, CASES[check])


@pytest.mark.parametrize("check", ["rm", "group-raw", "defaults"])
def test_the_unplanted_copy_passes(check):
    run_check(planted("def train_ppo(", "def train_ppo(", "none"), check)


@pytest.mark.parametrize("name, old, new, check", SLIPS, ids=[s[0] for s in SLIPS])
def test_slip_is_caught(name, old, new, check):
    module = planted(old, new, name)
    with pytest.raises(AssertionError):
        run_check(module, check)
