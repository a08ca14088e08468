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
