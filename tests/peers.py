"""The trainers' functions for the tests (valuelab.integrations.peers), skipped where a trainer is absent.

Under ``REQUIRE_PEERS`` (CI) an absent trainer is an error, not a skip.
"""

from __future__ import annotations

import os
import types

import pytest

from valuelab.integrations import peers


def _need(package: str) -> None:
    if peers.installed(package):
        return
    if os.environ.get("REQUIRE_PEERS"):
        raise RuntimeError(f"REQUIRE_PEERS is set but {package}=={peers.VERSIONS[package]} is not installed")
    pytest.skip(f"{package} is not installed: pip install --no-deps -r requirements-peers.txt")


def verl_gae():
    _need("verl")
    return peers.verl_gae()


def verl_compute_advantage(core_algos=None):
    _need("verl")
    return peers.verl_compute_advantage(core_algos if core_algos is not None else types.ModuleType("core_algos"))


def openrlhf_gae():
    _need("openrlhf")
    return peers.openrlhf_gae()


def trl_ppo_block():
    _need("trl")
    return peers.trl_ppo_block()


# --- the trainers' real modules and processes -------------------------------------------------------------

GPU_ONLY = ("flash_attn", "deepspeed", "vllm", "bitsandbytes")
"""Packages OpenRLHF's modules import at the top that have no CPU build on PyPI (CUDA kernels, GPU engines)."""


def gpu_only_standins() -> None:
    """Let ``import openrlhf.trainer.ppo_utils.experience_maker`` run on a CPU machine.

    Puts an import hook in front of ``sys.meta_path`` that answers the
    packages of :data:`GPU_ONLY` (and only those) with empty stand-in modules
    whose every attribute is a placeholder class. OpenRLHF's own modules are
    then imported for real; the code under test (the experience maker's GAE
    and its caller) never touches a stand-in. Idempotent; usable as part of a
    Ray worker's setup hook.
    """
    import importlib.abc
    import importlib.machinery
    import sys

    if any(getattr(f, "_valuelab_standin", False) for f in sys.meta_path):
        return

    class StandIn(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return type(name, (), {"__module__": self.__name__})

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        _valuelab_standin = True

        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in GPU_ONLY:
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            module = StandIn(spec.name)
            module.__path__ = []
            return module

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, Finder())


def need_trainer_runtime(package: str) -> None:
    """Skip (or, under REQUIRE_PEERS, fail) unless ``package`` and Ray import for real."""
    _need(package)
    try:
        import ray  # noqa: F401
        if package == "verl":
            import verl.trainer.ppo.ray_trainer  # noqa: F401
        else:
            gpu_only_standins()
            import openrlhf.trainer.ppo_utils.experience_maker  # noqa: F401
    except ImportError as e:
        if os.environ.get("REQUIRE_PEERS"):
            raise
        pytest.skip(f"{package}'s runtime is not importable ({e}): pip install -r requirements-trainers.txt")
