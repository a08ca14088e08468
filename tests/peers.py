"""Load one function from an installed trainer's source file, without importing the trainer's package.

verl's and OpenRLHF's package ``__init__`` pull in ray, deepspeed, vLLM and
more. The functions valuelab is checked against need only torch, so
:func:`peer_function` finds the installed file (``importlib.util.find_spec``
of the top-level package does not run its ``__init__``), takes the function's
source as the package ships it, and executes it in a small namespace. The
code under test is the trainer's own, byte for byte.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

PEERS = {"verl": "0.9.1", "openrlhf": "0.11.2", "trl": "0.19.1"}  # = requirements-peers.txt


def peer_file(package: str, relpath: str) -> Path:
    """The installed source file ``relpath`` of ``package``; skips (or fails under REQUIRE_PEERS) when absent."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        if os.environ.get("REQUIRE_PEERS"):
            raise RuntimeError(f"REQUIRE_PEERS is set but {package} is not installed (requirements-peers.txt)")
        pytest.skip(f"{package} is not installed: pip install --no-deps -r requirements-peers.txt")
    version = importlib.metadata.version(package)
    assert version == PEERS[package], f"{package} {version} installed, the tests are written for {PEERS[package]}"
    return Path(list(spec.submodule_search_locations)[0]) / relpath


def peer_function(package: str, relpath: str, name: str, namespace: dict, cls: str | None = None):
    """The function (or ``cls``'s method) ``name`` from the installed file, executed in ``namespace``; decorators dropped."""
    path = peer_file(package, relpath)
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    scope = tree.body
    if cls is not None:
        scope = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    node = next(n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name)
    code = textwrap.dedent(ast.get_source_segment(source, node))
    ns = dict(namespace)
    exec(compile(code, f"{path}:{name}", "exec"), ns)  # noqa: S102 - the trainer's own code, from its installed package
    return ns[name]


def verl_gae():
    """verl's ``compute_gae_advantage_return`` and the ``masked_whiten`` it calls (verl.utils.torch_functional)."""
    import torch

    helpers = {"torch": torch}
    for fn in ("masked_sum", "masked_mean", "masked_var", "masked_whiten"):
        helpers[fn] = peer_function("verl", "utils/torch_functional.py", fn, helpers)
    verl_F = SimpleNamespace(**{k: v for k, v in helpers.items() if k != "torch"})
    return peer_function("verl", "trainer/ppo/core_algos.py", "compute_gae_advantage_return",
                         {"torch": torch, "verl_F": verl_F})


def verl_compute_advantage():
    """verl's ``ray_trainer.compute_advantage`` (the GAE branch reads ``core_algos.compute_gae_advantage_return``)."""
    import torch

    return peer_function("verl", "trainer/ppo/ray_trainer.py", "compute_advantage", {"torch": torch})


def openrlhf_gae():
    """OpenRLHF's ``get_advantages_and_returns`` (a method of the experience maker; ``self`` is unused)."""
    import typing

    import torch

    relpath = "trainer/ppo_utils/experience_maker.py"
    path = peer_file("openrlhf", relpath)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    owner = next(n.name for n in tree.body if isinstance(n, ast.ClassDef)
                 and any(isinstance(f, ast.FunctionDef) and f.name == "get_advantages_and_returns" for f in n.body))
    method = peer_function("openrlhf", relpath, "get_advantages_and_returns",
                           {"torch": torch, "Tuple": typing.Tuple, "Optional": typing.Optional}, cls=owner)
    return lambda *args, **kw: method(None, *args, **kw)


def trl_ppo_block():
    """TRL 0.19.1's PPO reward and GAE steps, as it runs them inline in ``PPOTrainer.train``.

    TRL keeps these steps inside ``train()``, not in a function of their own,
    so the statements from the padding masks to the whitened advantages are
    taken from the installed file as they are and run in a namespace that
    holds the tensors ``train()`` would have at that point. Returns a
    function of those tensors and ``args`` that returns the namespace after.
    """
    import torch

    path = peer_file("trl", "trainer/ppo_trainer.py")
    lines = path.read_text(encoding="utf-8").split("\n")
    first = next(i for i, line in enumerate(lines) if "response_idxs = torch.arange(responses.shape[1]" in line)
    last = next(i for i, line in enumerate(lines) if "advantages = torch.masked_fill(advantages, padding_mask, 0)" in line)
    code = compile(textwrap.dedent("\n".join(lines[first:last + 1])), f"{path}:train", "exec")
    core = {"torch": torch}
    for fn in ("masked_mean", "masked_var", "masked_whiten"):
        core[fn] = peer_function("trl", "core.py", fn, core)

    def run(**tensors):
        ns = {"torch": torch, "masked_whiten": core["masked_whiten"], "INVALID_LOGPROB": 1.0, **tensors}
        exec(code, ns)  # noqa: S102 - TRL's own statements, from its installed package
        return ns

    return run
