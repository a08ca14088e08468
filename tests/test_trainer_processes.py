"""The verl and OpenRLHF swaps where the trainers really run: their own modules, their own callers, their Ray workers.

verl 0.9.1 trains inside a Ray actor started by ``verl.trainer.main_ppo.run_ppo``;
OpenRLHF 0.11.2's experience maker lives in its ``PPOTrainer`` Ray actor. A
swap made in the launching process does not reach either (tested below: it
is the bug the worker hooks fix). The Ray tests start a real local Ray
(``num_cpus=1``) and, for verl, go through verl's own ``run_ppo`` with the
Hydra override a user types; the actor stands where verl's ``TaskRunner``
stands and calls verl's ``compute_advantage`` on a real ``DataProto``.
OpenRLHF's modules import GPU-only packages at the top; on this CPU machine
they get empty stand-ins (``peers.gpu_only_standins``), which the code under
test never calls.
"""

from __future__ import annotations

import os
import sys
import types

import pytest
import torch

import peers
from valuelab.integrations import openrlhf as vl_openrlhf
from valuelab.integrations import peers as vl_peers
from valuelab.integrations import verl as vl_verl

TOL = 1e-4  # float32 loops (verl, OpenRLHF) against valuelab's scan: rounding only; a wrong convention is off by > 0.1


# --------------------------------------------------------------------------------------------- verl


@pytest.fixture(scope="module")
def core_algos():
    peers.need_trainer_runtime("verl")
    import verl.trainer.ppo.core_algos as core_algos
    return core_algos


def test_verl_install_is_idempotent_and_restore_returns_verls(core_algos):
    original = core_algos.compute_gae_advantage_return
    assert original.__module__ == "verl.trainer.ppo.core_algos"
    assert core_algos.get_adv_estimator_fn("gae") is original
    first = vl_verl.install()
    second = vl_verl.install()
    try:
        assert core_algos.compute_gae_advantage_return is vl_verl.compute_gae_advantage_return
        assert core_algos.get_adv_estimator_fn("gae") is vl_verl.compute_gae_advantage_return
        assert core_algos.ADV_ESTIMATOR_REGISTRY["gae"] is vl_verl.compute_gae_advantage_return
        assert vl_verl.is_installed()
    finally:
        second()
    assert core_algos.compute_gae_advantage_return is original  # the second install's restore: verl's, not valuelab's
    assert core_algos.get_adv_estimator_fn("gae") is original
    assert not vl_verl.is_installed()
    first()
    assert core_algos.compute_gae_advantage_return is original


def test_verl_own_compute_advantage_in_process(core_algos):
    theirs = vl_peers.verl_advantages(1, 0.99, 0.95)
    restore = vl_verl.install()
    try:
        calls = []
        real = vl_verl.compute_gae_advantage_return
        core_algos.compute_gae_advantage_return = lambda **kw: calls.append(1) or real(**kw)  # spy on the installed one
        ours = vl_peers.verl_advantages(1, 0.99, 0.95)
    finally:
        restore()
    assert calls == [1]  # verl's compute_advantage called valuelab's function, once
    torch.testing.assert_close(ours, theirs, rtol=TOL, atol=TOL)


@pytest.fixture(scope="module")
def verl_reference(core_algos):
    assert core_algos.compute_gae_advantage_return.__module__ == "verl.trainer.ppo.core_algos"
    return vl_peers.verl_advantages(2, 0.99, 0.95)


def test_verl_ray_hook_reaches_the_task_runner(verl_reference):
    report = vl_peers.verl_run_ppo([vl_verl.HYDRA_OVERRIDE])
    assert report["runtime_env"]["worker_process_setup_hook"] == vl_verl.RAY_WORKER_SETUP
    assert report["pid"] != os.getpid()  # another process: the actor
    assert report["attribute"] == "valuelab.integrations.verl"
    assert report["registry"] == "valuelab.integrations.verl"
    torch.testing.assert_close(report["advantages"], verl_reference, rtol=TOL, atol=TOL)


def test_verl_without_the_hook_the_task_runner_keeps_verls(verl_reference):
    report = vl_peers.verl_run_ppo([])
    assert report["pid"] != os.getpid()
    assert report["attribute"] == "verl.trainer.ppo.core_algos"
    assert report["registry"] == "verl.trainer.ppo.core_algos"
    torch.testing.assert_close(report["advantages"], verl_reference, rtol=TOL, atol=TOL)


def test_verl_driver_only_install_does_not_reach_the_task_runner(core_algos):
    """The trap the hook fixes: install() in the launching process leaves verl's GAE in the actor."""
    restore = vl_verl.install()
    try:
        assert core_algos.compute_gae_advantage_return is vl_verl.compute_gae_advantage_return
        report = vl_peers.verl_run_ppo([])
    finally:
        restore()
    assert report["attribute"] == "verl.trainer.ppo.core_algos"


def test_the_trainers_extra_is_requirements_trainers():
    """pyproject's ``trainers`` extra (Colab installs it) and requirements-trainers.txt (make installs it) agree."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    extra = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["trainers"]
    lines = [ln.strip() for ln in (root / "requirements-trainers.txt").read_text().splitlines()]
    assert extra == [ln for ln in lines if ln and not ln.startswith("#")]


# ------------------------------------------------------------------------------------------- OpenRLHF


@pytest.fixture(scope="module")
def experience_maker():
    peers.need_trainer_runtime("openrlhf")
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
    return RemoteExperienceMaker


def _openrlhf_run(cls, seed: int = 3, samples: int = 4, per_prompt: int = 2):
    """OpenRLHF's own caller, compute_advantages_and_returns, on an instance of its experience maker."""
    from openrlhf.trainer.ppo_utils.experience import Experience

    maker = cls.__new__(cls)  # no Ray actor groups: only the advantage step is run
    ns = types.SimpleNamespace
    args = ns(rollout=ns(n_samples_per_prompt=per_prompt),
              algo=ns(advantage=ns(estimator="gae", gamma=0.99, lambd=0.95, no_std_norm=False)),
              reward=ns(clip_range=None))
    maker.strategy, maker.advantage_estimator, maker.kl_ctl = ns(args=args), "gae", ns(value=0.05)
    experiences = []
    for i in range(2):
        _, values, mask = vl_peers.demo_batch(seed + i, rows=samples // 2)
        g = torch.Generator().manual_seed(seed + 10 + i)
        experiences.append(Experience(values=values, action_mask=mask.bool(), kl=torch.rand(values.shape, generator=g),
                                      rewards=torch.randn(samples // 2, generator=g),
                                      index=[2 * i, 2 * i + 1], info={}))
    return maker.compute_advantages_and_returns(experiences)


def test_openrlhf_install_binds_onto_the_experience_maker(experience_maker):
    original = experience_maker.get_advantages_and_returns
    theirs = _openrlhf_run(experience_maker)
    first = vl_openrlhf.install()
    vl_openrlhf.install()
    try:
        assert experience_maker.get_advantages_and_returns is vl_openrlhf.get_advantages_and_returns
        assert vl_openrlhf.is_installed()
        ours = _openrlhf_run(experience_maker)
    finally:
        first()
    assert experience_maker.get_advantages_and_returns is original
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.advantages, b.advantages, rtol=TOL, atol=TOL)
        torch.testing.assert_close(a.returns, b.returns, rtol=TOL, atol=TOL)


def _openrlhf_setup(with_valuelab: bool):
    def setup():
        peers.gpu_only_standins()
        if with_valuelab:
            vl_openrlhf.ray_worker_setup()
    return setup


def _openrlhf_in_ray(hook_with_valuelab: bool):
    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cloudpickle.register_pickle_by_value(peers)

    @ray.remote(num_cpus=0)
    class PPOTrainer:  # stands where OpenRLHF's PPOTrainer actor holds its experience maker
        def run(self):
            from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

            out = _openrlhf_run(RemoteExperienceMaker)
            return {"pid": os.getpid(), "method": RemoteExperienceMaker.get_advantages_and_returns.__module__,
                    "advantages": [e.advantages.tolist() for e in out]}

    ray.init(num_cpus=1, include_dashboard=False,
             runtime_env={"worker_process_setup_hook": _openrlhf_setup(hook_with_valuelab)})
    try:
        return ray.get(PPOTrainer.remote().run.remote())
    finally:
        ray.shutdown()


@pytest.mark.parametrize("hook", [True, False], ids=["hook", "no-hook"])
def test_openrlhf_ray_hook_reaches_the_trainer_actor(experience_maker, hook):
    report = _openrlhf_in_ray(hook)
    assert report["pid"] != os.getpid()
    assert report["method"] == ("valuelab.integrations.openrlhf" if hook else "openrlhf.trainer.ppo_utils.experience_maker")
    reference = _openrlhf_run(experience_maker)  # OpenRLHF's own method, in this process
    for adv, e in zip(report["advantages"], reference):
        torch.testing.assert_close(torch.tensor(adv), e.advantages, rtol=TOL, atol=TOL)


def test_openrlhf_install_refuses_what_is_not_the_experience_maker():
    with pytest.raises(TypeError, match="experience_maker"):
        vl_openrlhf.install(int)
    with pytest.raises(TypeError, match="core_algos"):
        vl_verl.install(types.ModuleType("not_verl"))
