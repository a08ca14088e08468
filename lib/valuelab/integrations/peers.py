"""The trainers' own functions, read from their installed packages without importing them (chapter 14 (:doc:`/chapters/14_trainers`)).

verl's and OpenRLHF's package ``__init__`` pull in ray, deepspeed, vLLM and
more. The functions valuelab is compared with need only torch, so
:func:`load_function` finds the installed source file
(``importlib.util.find_spec`` of the top-level package does not run its
``__init__``), takes the function's source as the package ships it and
executes it in a small namespace. The code compared is the trainer's own,
unchanged. Install the trainers with
``pip install --no-deps verl==0.9.1 openrlhf==0.11.2 trl==0.19.1``
(``requirements-peers.txt``).
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import textwrap
import typing
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Dict, Optional

import torch

from .._engine.checks import check_flag, check_positive_int, check_scalar, check_seed

__all__ = ["VERSIONS", "installed", "source_file", "load_function", "verl_gae", "verl_compute_advantage",
           "openrlhf_gae", "trl_ppo_block", "runtime_available", "demo_batch", "verl_advantages", "verl_run_ppo",
           "torchrl_functional"]

VERSIONS = {"verl": "0.9.1", "openrlhf": "0.11.2", "trl": "0.19.1"}
"""The releases the integrations were checked against (``requirements-peers.txt``)."""


def installed(package: str) -> bool:
    """True when ``package`` is installed in the release of :data:`VERSIONS`."""
    if package not in VERSIONS:
        raise ValueError(f"package must be one of {tuple(VERSIONS)}, got {package!r}")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return False
    try:
        return importlib.metadata.version(package) == VERSIONS[package]
    except importlib.metadata.PackageNotFoundError:
        return False


def source_file(package: str, relpath: str) -> Path:
    """The installed file ``relpath`` of ``package`` (``FileNotFoundError`` when the package is not installed)."""
    if not installed(package):
        raise FileNotFoundError(f"{package}=={VERSIONS.get(package)} is not installed: pip install --no-deps -r requirements-peers.txt")
    spec = importlib.util.find_spec(package)
    return Path(list(spec.submodule_search_locations)[0]) / relpath


def load_function(package: str, relpath: str, name: str, namespace: Dict, cls: Optional[str] = None) -> Callable:
    """The function (or ``cls``'s method) ``name`` of the installed file, executed in a copy of ``namespace``; decorators dropped."""
    path = source_file(package, relpath)
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    scope = tree.body
    if cls is not None:
        scope = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    node = next((n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if node is None:
        raise LookupError(f"{name} not found in {path}")
    ns = dict(namespace)
    exec(compile(textwrap.dedent(ast.get_source_segment(source, node)), f"{path}:{name}", "exec"), ns)  # noqa: S102
    return ns[name]


def verl_gae() -> Callable:
    """verl's ``compute_gae_advantage_return`` with the ``masked_whiten`` it calls (``verl.utils.torch_functional``)."""
    helpers: Dict = {"torch": torch}
    for fn in ("masked_sum", "masked_mean", "masked_var", "masked_whiten"):
        helpers[fn] = load_function("verl", "utils/torch_functional.py", fn, helpers)
    verl_F = SimpleNamespace(**{k: v for k, v in helpers.items() if k != "torch"})
    return load_function("verl", "trainer/ppo/core_algos.py", "compute_gae_advantage_return", {"torch": torch, "verl_F": verl_F})


def verl_compute_advantage(core_algos: object) -> Callable:
    """verl's ``ray_trainer.compute_advantage``, reading GAE from ``core_algos`` (a module whose function can be swapped)."""
    return load_function("verl", "trainer/ppo/ray_trainer.py", "compute_advantage",
                         {"torch": torch, "core_algos": core_algos, "AdvantageEstimator": SimpleNamespace(GAE="gae")})


def openrlhf_gae() -> Callable:
    """OpenRLHF's ``get_advantages_and_returns`` (a method of its experience maker; ``self`` is unused)."""
    relpath = "trainer/ppo_utils/experience_maker.py"
    tree = ast.parse(source_file("openrlhf", relpath).read_text(encoding="utf-8"))
    owner = next(n.name for n in tree.body if isinstance(n, ast.ClassDef)
                 and any(isinstance(f, ast.FunctionDef) and f.name == "get_advantages_and_returns" for f in n.body))
    method = load_function("openrlhf", relpath, "get_advantages_and_returns",
                           {"torch": torch, "Tuple": typing.Tuple, "Optional": typing.Optional}, cls=owner)
    return lambda *args, **kw: method(None, *args, **kw)


def trl_ppo_block() -> Callable:
    """TRL 0.19.1's PPO reward and GAE steps, which it runs inline in ``PPOTrainer.train``.

    The statements from the padding masks to the whitened advantages are
    taken from the installed file as they are. The returned function runs
    them on the tensors ``train()`` holds at that point (``responses``,
    ``sequence_lengths``, ``logprobs``, ``ref_logprobs``, ``values``,
    ``scores`` and ``args``) and returns the namespace after them.
    """
    path = source_file("trl", "trainer/ppo_trainer.py")
    lines = path.read_text(encoding="utf-8").split("\n")
    first = next(i for i, line in enumerate(lines) if "response_idxs = torch.arange(responses.shape[1]" in line)
    last = next(i for i, line in enumerate(lines) if "advantages = torch.masked_fill(advantages, padding_mask, 0)" in line)
    code = compile(textwrap.dedent("\n".join(lines[first:last + 1])), f"{path}:train", "exec")
    core: Dict = {"torch": torch}
    for fn in ("masked_mean", "masked_var", "masked_whiten"):
        core[fn] = load_function("trl", "core.py", fn, core)

    def run(**tensors: object) -> Dict:
        ns = {"torch": torch, "masked_whiten": core["masked_whiten"], "INVALID_LOGPROB": 1.0, **tensors}
        with warnings.catch_warnings():  # TRL indexes with a list of tensors, which newer torch warns about
            warnings.filterwarnings("ignore", message="Using a non-tuple sequence for multidimensional indexing")
            exec(code, ns)  # noqa: S102 - TRL's own statements, from its installed package
        return ns

    return run


# --- the trainers' real modules and processes (chapter 14; tests/test_trainer_processes.py) ----------------


def runtime_available() -> bool:
    """True when verl's trainer module and Ray import for real (``requirements-trainers.txt`` and the peers installed).

    The import's console chatter (verl's warnings about engines it lacks) is kept out of the caller's output.
    """
    import contextlib  # noqa: PLC0415
    import io  # noqa: PLC0415

    if not installed("verl") or importlib.util.find_spec("ray") is None:
        return False
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import verl.trainer.ppo.ray_trainer  # noqa: F401, PLC0415
        except ImportError:
            return False
    return True


def demo_batch(seed: int, rows: int = 6, length: int = 12):
    """``(rewards, values, mask)``: random float32 ``(rows, length)`` tensors, right padding and holes (mask int64).

    ``seed`` in ``[0, 2**63 - 1]`` (``valuelab._engine.checks.check_seed``), ``length`` at least 3.
    """
    seed = check_seed(seed)
    rows = check_positive_int(rows, "rows")
    length = check_positive_int(length, "length")
    if length < 3:
        raise ValueError(f"length must be at least 3 (every row holds 3 to length tokens), got {length}")
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(rows, length, generator=g)
    values = torch.randn(rows, length, generator=g)
    lengths = torch.randint(3, length + 1, (rows,), generator=g)
    mask = torch.arange(length)[None] < lengths[:, None]
    hole = torch.rand(rows, length, generator=g) < 0.25
    hole[:, 0] = False
    return rewards, values, (mask & ~hole).long()


def _unit(x: object, name: str) -> float:
    """A discount in [0, 1] as a float, for verl's config: ``True`` or ``"0.9"`` refused (``valuelab._engine.checks.check_scalar``)."""
    v = check_scalar(x, name)
    if not 0.0 <= v <= 1.0:  # NaN fails the comparison
        raise ValueError(f"{name} must lie in [0, 1], got {v}")
    return v


def verl_advantages(seed: int, gamma: float, lam: float) -> torch.Tensor:
    """verl's own ``ray_trainer.compute_advantage`` on :func:`demo_batch` in this process (whatever GAE ``core_algos`` holds)."""
    seed = check_seed(seed)
    gamma, lam = _unit(gamma, "gamma"), _unit(lam, "lam")
    from verl.protocol import DataProto  # noqa: PLC0415
    from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: PLC0415

    rewards, values, mask = demo_batch(seed)
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "values": values, "response_mask": mask})
    return compute_advantage(data, "gae", gamma=gamma, lam=lam, config={"use_pf_ppo": False}).batch["advantages"]


def verl_run_ppo(overrides=(), *, seed: int = 2, gamma: float = 0.99, lam: float = 0.95, quiet: bool = True) -> Dict:
    """verl's own launcher, ``verl.trainer.main_ppo.run_ppo``, with a probe where its ``TaskRunner`` actor stands.

    The config is verl's ``ppo_trainer.yaml`` composed with Hydra and
    ``overrides`` (what a user types on the command line), plus one CPU for
    Ray. ``run_ppo`` calls ``ray.init`` with the ``runtime_env`` it builds
    and runs the actor's ``run(config)``; the probe calls verl's
    ``compute_advantage`` on :func:`demo_batch` there and reports its process
    id, the module of ``core_algos.compute_gae_advantage_return`` and of
    ``get_adv_estimator_fn("gae")``, and the advantages. Ray is shut down
    after. Needs :func:`runtime_available`; takes about 10 s. ``quiet``
    keeps verl's and Ray's console output (its ``ray init kwargs`` line,
    the workers' logs) out of the caller's.
    """
    seed = check_seed(seed)
    gamma, lam = _unit(gamma, "gamma"), _unit(lam, "lam")
    quiet = check_flag(quiet, "quiet")
    if isinstance(overrides, (str, bytes)) or not all(isinstance(o, str) for o in overrides):
        raise TypeError("overrides must be a sequence of str (Hydra overrides such as 'trainer.n_gpus_per_node=1')")
    import contextlib  # noqa: PLC0415
    import io  # noqa: PLC0415
    import logging  # noqa: PLC0415
    import json  # noqa: PLC0415
    import os  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    import ray  # noqa: PLC0415
    import verl  # noqa: PLC0415
    from hydra import compose, initialize_config_dir  # noqa: PLC0415
    from verl.trainer.main_ppo import run_ppo  # noqa: PLC0415

    if ray.is_initialized():
        raise RuntimeError("Ray is already running in this process: verl's run_ppo would not start it with its runtime_env")
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        quiet_ray = ["+ray_kwargs.ray_init.log_to_driver=false", f"+ray_kwargs.ray_init.logging_level={logging.ERROR}"]
        config = compose("ppo_trainer", overrides=[*overrides, "ray_kwargs.ray_init.num_cpus=1",
                                                   f"algorithm.gamma={gamma}", f"algorithm.lam={lam}",
                                                   *(quiet_ray if quiet else [])])
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.json")

        @ray.remote(num_cpus=0)
        class TaskRunner:
            def run(self, config):
                import verl.trainer.ppo.core_algos as core_algos  # noqa: PLC0415

                adv = verl_advantages(seed, float(config.algorithm.gamma), float(config.algorithm.lam))
                report = {"pid": os.getpid(), "attribute": core_algos.compute_gae_advantage_return.__module__,
                          "registry": core_algos.get_adv_estimator_fn("gae").__module__, "advantages": adv.tolist()}
                with open(out, "w", encoding="utf-8") as f:
                    json.dump(report, f)

        sink = io.StringIO()
        muted = (contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), warnings.catch_warnings())
        with contextlib.ExitStack() as stack:
            if quiet:
                for m in muted:
                    stack.enter_context(m)
                warnings.simplefilter("ignore")
            try:
                run_ppo(config, task_runner_class=TaskRunner)
            finally:
                ray.shutdown()
        with open(out, encoding="utf-8") as f:
            report = json.load(f)
    report["runtime_env"] = {k: v for k, v in config.ray_kwargs.ray_init.runtime_env.items()}
    report["advantages"] = torch.tensor(report["advantages"])
    return report


def torchrl_functional():
    """TorchRL's ``torchrl.objectives.value.functional`` module (its own GAE functions), or ImportError."""
    import torchrl.objectives.value.functional as functional  # noqa: PLC0415

    return functional
