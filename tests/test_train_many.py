"""valuelab.lab.ppo.train_many: jobs over forked processes give exactly what train_ppo gives in one process."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from valuelab.lab.policy import make_prompt_world
from valuelab.lab.ppo import Arm, PPOConfig, train_many, train_ppo


@pytest.fixture(scope="module")
def world():
    return make_prompt_world(n_prompts=2, vocab_size=3, max_len=8, eos_range=(0.1, 0.2), max_count=8, beta=0.05, seed=3)


def test_forked_jobs_equal_one_process_runs(world):
    cfg = PPOConfig(iterations=3, samples_per_prompt=4, minibatches=2)
    critic = Arm("c", lam_actor=0.95, lam_critic=1.0, critic_start="reward-model")
    group = Arm("g", estimator="group")
    jobs = [(world, critic, cfg), (world, group, PPOConfig(iterations=3, samples_per_prompt=4, minibatches=2, whiten=False), [5, 6])]
    many = train_many(jobs, [1, 2, 3], processes=2, device="cpu")
    alone = [train_ppo(world, critic, [1, 2, 3], cfg, device="cpu"),
             train_ppo(world, group, [5, 6], jobs[1][2], device="cpu")]
    for h, ref in zip(many, alone):
        assert h.seeds == ref.seeds
        for field in ("objective", "length", "kappa", "clip_fraction"):
            np.testing.assert_array_equal(getattr(h, field), getattr(ref, field))
    # run i depends on its seed only: the first two runs of a 3-seed job are the runs of a 2-seed job
    two = train_many([(world, critic, cfg)], [1, 2], processes=1, device="cpu")[0]
    np.testing.assert_array_equal(two.objective, many[0].objective[:2])
    assert not np.array_equal(many[0].objective[0], many[0].objective[1])  # different seeds, different runs


def test_train_many_refuses_bad_jobs(world):
    cfg = PPOConfig(iterations=1, samples_per_prompt=4, minibatches=2)
    arm = Arm("g", estimator="group")
    with pytest.raises(TypeError, match=r"jobs\[0\]"):
        train_many([(world, arm)], [1])
    with pytest.raises(ValueError, match=r"jobs\[0\] has no seeds"):
        train_many([(world, arm, cfg)])
    with pytest.raises(ValueError, match="seeds"):
        train_many([(world, arm, cfg, [])])
    with pytest.raises(ValueError, match="processes"):
        train_many([(world, arm, cfg)], [1], processes=0)
