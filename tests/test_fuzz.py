"""Property-based tests of every public function, with hostile inputs (issue 25).

For each public function (the table ``fuzz_targets.TARGETS``; a test below
fails when a function of a public module's ``__all__`` has no entry),
hypothesis draws calls in three modes -- valid arguments with ordinary
values, the documented shapes and types with hostile values (NaN, ±inf,
subnormals, ±1e308, integer extremes), and one or two arguments replaced by
anything (every dtype, layout, device; scalars of every Python type) -- and
runs each in a worker process (``fuzz_runner``) that checks the same
properties for every call:

* the call returns a correct result (the entry's oracle: ``valuelab.lab.reference``
  or an independent computation), or raises TypeError/ValueError whose
  message names one of the function's parameters; a valid call returns;
* it never crashes the process, never runs past a time bound, never spawns
  processes without bound;
* finite inputs never give NaN or inf;
* it never changes its inputs.

Profiles (``tests/conftest.py``): the default ``ci`` runs 250 examples per
cheap function, about 15,000 in all (``make test``: about two minutes on 2
cores); ``HYPOTHESIS_PROFILE=fuzz`` (``make fuzz``) runs 2,500 per cheap
function, about 150,000 in all. The session prints the number of examples run.
A failure found by the long run becomes an explicit example in
``REGRESSIONS`` (at the end of this file), run before the drawn ones.
``FUZZ_FINDINGS=path`` appends every failing call (JSON lines) to ``path``;
``FUZZ_SURVEY=1`` logs failures without failing, to survey a library.
"""

from __future__ import annotations

import importlib
import inspect
import json
import math  # noqa: F401 - nan and inf for the examples' recipes
import os
from math import inf, nan  # noqa: F401

import numpy as np  # noqa: F401
import pytest
import torch  # noqa: F401
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import fuzz_recipes
import fuzz_runner
import fuzz_targets
from fuzz_recipes import O, T, perturb  # noqa: F401
from fuzz_runner import Call
from fuzz_targets import NOT_FUZZED, TARGETS

PUBLIC_MODULES = [
    "valuelab",
    "valuelab.packed",
    "valuelab.losses",
    "valuelab.integrations",
    "valuelab.integrations.verl",
    "valuelab.integrations.openrlhf",
    "valuelab.integrations.trl",
    "valuelab.integrations.torchrl",
    "valuelab.lab.stats",
    "valuelab.lab.policy",
    "valuelab.lab.ppo",
    "valuelab.lab.transformer",
    "valuelab.distributed",
]

SURVEY = bool(os.environ.get("FUZZ_SURVEY"))
"""``FUZZ_SURVEY=1``: log failures (with ``FUZZ_FINDINGS``) and go on, so that each function's whole budget explores
(hypothesis stops exploring at a function's first failure otherwise); the tests then pass. For collecting findings."""

COUNTER = {"examples": 0, "failures": 0}
"""Examples run in this session (read by conftest.pytest_terminal_summary)."""


class FuzzFailure(AssertionError):
    """A property failed; one subclass per kind, so that hypothesis reports each kind of failure on its own."""


FAILURES = {kind: type(f"Fuzz_{kind}", (FuzzFailure,), {"__doc__": what}) for kind, what in fuzz_runner.KINDS.items()}


def public_callables():
    """``(module, name, object)`` for every callable in the ``__all__`` of the public modules (classes included)."""
    for mod_name in PUBLIC_MODULES:
        mod = importlib.import_module(mod_name)
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.ismodule(obj) or not callable(obj):
                continue
            yield mod_name, name, obj


def canonical(obj) -> str:
    return f"{obj.__module__}.{getattr(obj, '__qualname__', obj.__name__)}"


def test_every_public_function_has_a_fuzz_entry():
    """A new public function cannot escape the suite: each one needs an entry (a class may be listed as data only)."""
    table = {id(fuzz_runner.resolve(name)): name for name in TARGETS}
    missing = []
    for mod_name, name, obj in public_callables():
        if id(obj) in table:
            continue
        if inspect.isclass(obj) and canonical(obj) in NOT_FUZZED:
            continue
        missing.append(f"{mod_name}.{name}" + (" (a class: add it to NOT_FUZZED with a reason, or fuzz it)"
                                               if inspect.isclass(obj) else ""))
    assert not missing, f"public functions without a fuzz entry in tests/fuzz_targets.py: {missing}"
    for name in NOT_FUZZED:
        assert inspect.isclass(fuzz_runner.resolve(name)), f"NOT_FUZZED may list classes only, not {name}"


def test_every_entry_names_a_public_function():
    public = {id(obj) for _, _, obj in public_callables()}
    stray = [name for name in TARGETS if id(fuzz_runner.resolve(name)) not in public]
    assert not stray, f"entries for functions that are not public: {stray}"


# ---------------------------------------------------------------------------
# the calls
# ---------------------------------------------------------------------------


@st.composite
def calls(draw, spec: fuzz_targets.Target):
    """A call of ``spec``: valid, valid shapes with extreme values, or one or two arguments made hostile."""
    mode = draw(st.sampled_from(spec.modes))
    kwargs = dict(draw(spec.valid(mode == "extreme")))
    varargs = tuple(kwargs.pop("*args", ()))
    if mode == "hostile":
        names = list(kwargs) + [f"*{i}" for i in range(len(varargs))]
        if names:
            chosen = draw(st.permutations(names))[: draw(st.integers(1, min(2, len(names))))]
            varargs = list(varargs)
            for name in chosen:
                if name.startswith("*"):
                    varargs[int(name[1:])] = draw(perturb(varargs[int(name[1:])]))
                else:
                    kwargs[name] = draw(perturb(kwargs[name]))
            varargs = tuple(varargs)
    return Call(spec.name, kwargs, mode, varargs)


_WORKER = fuzz_runner.Worker()


@pytest.fixture(scope="module")
def worker():
    yield _WORKER
    _WORKER.stop()


def _log(call: Call, kind: str, message: str) -> None:
    path = os.environ.get("FUZZ_FINDINGS")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"target": call.target, "kind": kind, "message": message, "mode": call.mode,
                                "call": repr(call), "python": fuzz_recipes.render(call.kwargs) +
                                (f" *{fuzz_recipes.render(call.varargs)}" if call.varargs else "")}) + "\n")


def run_call(worker: fuzz_runner.Worker, call: Call) -> None:
    """One example: run it in the worker and turn a failed property into its failure class."""
    spec = TARGETS[call.target]
    COUNTER["examples"] += 1
    status, kind, message = worker.run(call, spec.timeout)
    if status != "ok":
        COUNTER["failures"] += 1
        _log(call, kind, message)
        if not SURVEY:
            raise FAILURES[kind](f"{call.target} ({call.mode} call) {fuzz_runner.KINDS[kind]}: {message}")


PER_FUNCTION = {"ci": 250}
"""Examples per cheap function (an entry's ``weight`` scales it) under a profile, when not the profile's
``max_examples``: the default profile ``ci`` gives 60 to the other property tests and 250 here (about two minutes for
the whole suite on 2 cores); ``fuzz`` (``make fuzz``) gives 2,500, at least 100,000 in all."""


def examples_for(spec: fuzz_targets.Target) -> int:
    profile = os.environ.get("HYPOTHESIS_PROFILE", "ci")
    return max(1, round(PER_FUNCTION.get(profile, settings.default.max_examples) * spec.weight))


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_fuzz(name, worker):
    spec = TARGETS[name]

    @settings(max_examples=examples_for(spec), deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                                     HealthCheck.large_base_example])
    @given(call=calls(spec))
    def check(call):
        run_call(worker, call)

    for call in REGRESSIONS.get(name, []) + spec.examples:
        check = example(call=call)(check)
    check()


# ---------------------------------------------------------------------------
# regression examples: failures found by the long run (make fuzz), kept as explicit examples
# ---------------------------------------------------------------------------

M64 = 2**63 - 1
F32 = "float32"


def _c(name: str, mode: str = "hostile", /, *varargs, **kwargs) -> Call:
    """A regression example: ``name(*varargs, **kwargs)`` in ``mode``."""
    return Call(name, kwargs, mode, varargs)


REGRESSIONS = {
    # index arithmetic that overflows: differences of [0, 2**63 - 1, -2, 4] wrap around and pass a check by subtraction
    "valuelab.packed.packing": [
        _c("valuelab.packed.packing", cu_seqlens=T((4,), "int64", (0, M64, -2, 4)), n_tokens=4),
        _c("valuelab.packed.packing", cu_seqlens=T((2,), "int64", (0, 0), device="meta"), n_tokens=0),
    ],
    "valuelab.packed.gae_packed": [
        _c("valuelab.packed.gae_packed", rewards=T((4,), F32), values=T((4,), F32),
           cu_seqlens=T((4,), "int64", (0, M64, -2, 4)), gamma=1.0, lam=0.95, truncated=None, bootstrap=None),
    ],
    "valuelab.packed.discounted_returns_packed": [  # a flag tensor with no data behind it: a segfault
        _c("valuelab.packed.discounted_returns_packed", rewards=T((0,), F32), cu_seqlens=T((3,), "int64", (0, 0, 0)),
           gamma=0.0, truncated=T((2,), "bool", (False,), layout="freed"), bootstrap=T((2,), F32)),
    ],
    # loops with no bound
    "valuelab.lab.stats.t_quantile": [
        _c("valuelab.lab.stats.t_quantile", p=0.75, df=2**63),
        _c("valuelab.lab.stats.t_quantile", p=[0.5], df=1),
    ],
    # silent broadcasting and coercion
    "valuelab.losses.aggregate": [
        _c("valuelab.losses.aggregate", per_token=T((), F32, (0.0,)), mask=T((1, 2), F32, (0.0,)), aggregation="token-mean"),
        _c("valuelab.losses.aggregate", per_token=T((1, 2), F32, device="meta"), mask=T((1, 2), F32),
           aggregation="token-mean"),
    ],
    "valuelab.losses.masked_whiten": [
        _c("valuelab.losses.masked_whiten", x=T((1, 2), F32, (0.0, 1.0)), mask=T((1, 2), "bool", (True,)), shift_mean=0,
           eps=1e-8, group=None, unbiased=False),
        _c("valuelab.losses.masked_whiten", "extreme", x=T((2,), "float64", (0.0, 1e308)), mask=T((2,), "bool", (True,)),
           shift_mean=True, eps=1e-8, group=None, unbiased=False),
    ],
    "valuelab.integrations.trl.from_trl": [
        _c("valuelab.integrations.trl.from_trl", rewards=T((1, 1), F32), values=T((1, 1), F32),
           sequence_lengths=T((1,), "int64", (0,)), phantom=0),
    ],
    "valuelab.lab.ppo.group_advantages": [
        _c("valuelab.lab.ppo.group_advantages", returns=T((2,), F32, (1.0, 2.0)), group=T((2,), "int64", (0, 0)),
           normalise=None, eps=1e-6),
        _c("valuelab.lab.ppo.group_advantages", "valid", returns=T((2,), F32, (0.0,)), group=T((2,), "int64", (0, 0)),
           normalise=True, eps=0.0),
        _c("valuelab.lab.ppo.group_advantages", returns=T((2,), F32, (1.0, 2.0)), group=T((2,), "int64", (-1, -1)),
           normalise=True, eps=1e-6),
        _c("valuelab.lab.ppo.group_advantages", returns=T((2,), F32, (1.0, 2.0)), group=T((2,), "int64", (2**40, 2**40)),
           normalise=True, eps=1e-6),
    ],
    # silent NaN and inf
    "valuelab.integrations.verl.whiten": [
        _c("valuelab.integrations.verl.whiten", "valid", values=T((1, 2), F32, (0.0,)), mask=T((1, 2), "bool", (True,)),
           eps=0.0),
    ],
    "valuelab.lab.ppo.policy_loss": [
        _c("valuelab.lab.ppo.policy_loss", "extreme", logprobs=T((1, 2), F32, (3.4e38,)), old_logprobs=T((1, 2), F32),
           advantages=T((1, 2), F32, (-3.0,)), mask=None, clip_range=0.0, aggregation="token-mean"),
    ],
    "valuelab.lab.stats.mean_ci": [_c("valuelab.lab.stats.mean_ci", "extreme", x=[0.0, 1e308], level=0.5)],
    "valuelab.losses.masked_mean": [
        _c("valuelab.losses.masked_mean", "extreme", x=T((2,), "float64", (1e308,)), mask=None, dim=None, group=None),
        _c("valuelab.losses.masked_mean", x=T((1, 2), F32), mask=None, dim=2, group=None),
    ],
    "valuelab.returns.td_targets": [
        _c("valuelab.returns.td_targets", "extreme", rewards=T((1, 2), F32), values=T((1, 2), F32), mask=None, gamma=0.0,
           bootstrap=1e308),
    ],
    "valuelab.lab.policy.count_good": [
        _c("valuelab.lab.policy.count_good", count=O("numpy", (T((2,), "int64", (1, 2)),)),
           length=O("numpy", (T((2,), "int64", (2, 3)),)), scale=0),
    ],
    # labels and seeds
    "valuelab.runtime.seed_everything": [
        _c("valuelab.runtime.seed_everything", seed=-1),
        _c("valuelab.runtime.seed_everything", seed=2**64 + 1),
        _c("valuelab.runtime.seed_everything", "valid", seed=np.int64(7)),
    ],
    "valuelab.distributed.demo_batch": [
        _c("valuelab.distributed.demo_batch", seed=True, rows=1, length=1),
        _c("valuelab.distributed.demo_batch", seed=0, rows=0, length=2),
    ],
    "valuelab.lab.policy.sample_responses": [
        _c("valuelab.lab.policy.sample_responses", world=O("world", (dict(n_prompts=1, vocab_size=3, max_len=1),)),
           probs=O("probs", (O("world", (dict(n_prompts=1, vocab_size=3, max_len=1),)), (1,), "ref", 0, "torch")),
           samples_per_prompt=1, generators=[-1], evaluation=None, dtype=torch.float32),
    ],
    # contracts broken quietly
    "valuelab.distributed.batch_statistics": [  # the caller's tensor gets a gradient
        _c("valuelab.distributed.batch_statistics", values=T((1, 3), F32, grad=True), returns=T((1, 3), F32, (0.0, 1.0)),
           old=T((1, 3), F32), mask=T((1, 3), "bool", (True,)), group=None, clip_range=0.2),
    ],
    "valuelab.distributed.run_on_ranks": [  # a result torch.save wrote that torch.load refuses
        _c("valuelab.distributed.run_on_ranks", "hostile", 4, np.uint8(4), fn=O("fn", ("fuzz_targets.rank_echo",)),
           world_size=1),
    ],
    "valuelab.losses.value_loss": [  # a global count below this shard's own count
        _c("valuelab.losses.value_loss", values=T((1, 3), F32, (1.0, 2.0, 3.0)), returns=T((1, 3), F32), mask=None,
           old_values=None, clip_range=None, aggregation="token-mean", group=None, global_count=1.0),
    ],
    "valuelab.lab.transformer.final_scores": [  # an efficient zero tensor of ids reaches an index op: a segfault
        _c("valuelab.lab.transformer.final_scores", model=O("model", (dict(n_models=1, n_tokens=1, max_positions=2, d_model=1,
                                                                          n_layers=1, n_heads=1, d_ff=1),)),
           inputs=T((1, 1, 2), "int64", layout="zero"), lengths=T((1,), "int64", (1,))),
        _c("valuelab.lab.transformer.final_scores", model=O("model", (dict(n_models=1, n_tokens=1, max_positions=2, d_model=1,
                                                                          n_layers=1, n_heads=1, d_ff=1),)),
           inputs=T((1, 1, 2), "int64", device="meta"), lengths=T((1,), "int64", (1,))),
    ],
    # messages that name no argument
    "valuelab.advantages.decoupled_gae": [
        _c("valuelab.advantages.decoupled_gae", rewards=T((1, 2), F32), values=T((1, 2), F32), mask=None, gamma=1.0,
           lam_actor=0.95, lam_critic=-1e-9, bootstrap=None),
    ],
    "valuelab.integrations._conventions.hole_convention": [
        _c("valuelab.integrations._conventions.hole_convention", name=["skip"]),
    ],
    "valuelab.integrations.trl.trl_advantages": [
        _c("valuelab.integrations.trl.trl_advantages", "valid", rewards=T((1, 1), F32), values=T((1, 1), F32),
           sequence_lengths=T((1,), "int64", (0,)), gamma=1.0, lam=0.95),
    ],
    "valuelab.integrations.verl.compute_gae_advantage_return": [
        _c("valuelab.integrations.verl.compute_gae_advantage_return", token_level_rewards=T((1, 2), F32),
           values=T((1, 2), F32), response_mask=T((1, 2), F32, (0.0,)), gamma=1.0, lam=0.95),
    ],
    "valuelab.lab.transformer.explained_variance": [
        _c("valuelab.lab.transformer.explained_variance", prediction=T((2, 5), F32), target=T((2, 5), F32, (0.0, 1.0)),
           mask=T((2, 5), "bool", (True,)), dim=2),
    ],
    "valuelab.lab.transformer.tile": [
        _c("valuelab.lab.transformer.tile", model=O("model", (dict(n_models=1, n_tokens=1, max_positions=1, d_model=1,
                                                               n_layers=1, n_heads=1, d_ff=1),)), times=2**31),
    ],
    "valuelab.lab.stats.pm": [
        _c("valuelab.lab.stats.pm", ci=O("interval_of", ([0.5, -1.0], 0.95)), decimals=2**63),
        _c("valuelab.lab.stats.pm", "valid", ci=O("interval_of", ([0.5, -1.0], 0.95)), decimals=np.int64(2)),
    ],
    # found by the default profile once the first round was fixed (tests/test_hardening_fuzz_findings.py)
    "valuelab.lab.transformer.TinyTransformer": [  # torch's "Overflow when unpacking long long"
        _c("valuelab.lab.transformer.TinyTransformer", n_models=1, n_tokens=2, max_positions=2, d_model=2,
           n_layers=np.uint64(2**64 - 1), n_heads=1, d_ff=2, seed=0),
    ],
    "valuelab.lab.policy.make_prompt_world": [  # numpy's "array is too big"
        _c("valuelab.lab.policy.make_prompt_world", n_prompts=1, vocab_size=2**31, max_len=2),
    ],
    "valuelab.lab.stats.paired_ci": [  # a view with the negative bit set: numpy() refused it
        _c("valuelab.lab.stats.paired_ci", "valid", a=T((3,), "float64", (1.0, 2.0, 4.0), layout="neg"),
           b=T((3,), "float64", (0.0, 1.0, 1.0)), level=0.95),
    ],
    "valuelab.integrations.torchrl.generalized_advantage_estimate": [  # +inf advantages from finite rewards
        _c("valuelab.integrations.torchrl.generalized_advantage_estimate", "extreme", gamma=1.0, lmbda=1.0,
           state_value=T((3, 1), "float64"), next_state_value=T((3, 1), "float64"),
           reward=T((3, 1), "float64", (1e308,)), done=T((3, 1), "bool", (False,)), terminated=None, time_dim=-2),
    ],
    "valuelab.rewards.kl_shaped_rewards": [  # RuntimeError from torch.full: a score beyond float32
        _c("valuelab.rewards.kl_shaped_rewards", "extreme", logprobs=T((1, 2), F32), ref_logprobs=T((1, 2), F32),
           score=1e308, mask=None, beta=0.1, estimator="k1"),
    ],
    "valuelab.distributed.shard_statistics": [  # outside a group: this rank's own statistics, passed off as the group's
        _c("valuelab.distributed.shard_statistics", "valid", rank=1, world_size=2, sizes=[1, 1], seed=1073741820),
    ],
}
REGRESSIONS["valuelab.lab.transformer.tile"].append(  # five million copies: a list of tensors for torch.cat, past the bound
    _c("valuelab.lab.transformer.tile", model=O("model", (dict(n_models=3, n_tokens=4, max_positions=1, d_model=2, n_layers=1,
                                                           n_heads=1, d_ff=4, seed=5044308),)), times=np.int64(5044308)))
REGRESSIONS["valuelab.lab.ppo.group_advantages"].append(  # the float32 variance overflowed: zeros, not [0.58, 0.58, -1.15]
    _c("valuelab.lab.ppo.group_advantages", "valid", returns=T((3,), F32, (65504.0, -1.4, -1e20)),
       group=T((3,), "int64", (0, 0, 0)), normalise=True, eps=1e-6))
REGRESSIONS["valuelab.integrations.verl.compute_gae_advantage_return"].append(  # -inf at the masked position
    _c("valuelab.integrations.verl.compute_gae_advantage_return", "extreme", token_level_rewards=T((1, 3), F32, (1e38, 0.0, 0.0)),
       values=T((1, 3), F32), response_mask=T((1, 3), F32, (1.0, 1.0, 0.0)), gamma=0.0, lam=0.0))
REGRESSIONS["valuelab.integrations.verl.compute_gae_advantage_return"].append(  # the oracle's: verl's mean over n + 1e-8,
    _c("valuelab.integrations.verl.compute_gae_advantage_return", "valid",  # amplified by whitening a spread of 1e-6
       token_level_rewards=T((6,), "float64", (3.0,), layout="offset"),
       values=T((6,), "bfloat16", (-2.4217135906219482,), layout="offset"),
       response_mask=T((6,), "bool", (True,), layout="offset"), gamma=T((), F32, (1e-6,)), lam=T((), F32, (1e-6,))))
REGRESSIONS["valuelab.losses.value_loss"].append(  # clamp(-1.8e308, 1.8e308) on float32: torch's RuntimeError
    _c("valuelab.losses.value_loss", values=T((4,), F32, (0.0, 0.362, -0.0357, 0.0)), returns=T((4,), F32, (2.79, 0.0)),
       mask=None, old_values=T((4,), F32, (1.627,)), clip_range=1.7976931348623157e308, aggregation="seq-mean-token-sum",
       group=None, global_count=3.0))
REGRESSIONS["valuelab.lab.policy.count_good"] += [  # float32 arithmetic; a scale that rounds to 0 in float32: NaN, -inf
    _c("valuelab.lab.policy.count_good", count=np.float32(42.18258), length=O("numpy", (T((0,), "int64"),)),
       scale=42.182580134228665),
    _c("valuelab.lab.policy.count_good", count=np.float32(23.495768), length=O("numpy", (T((3,), "int64", (20, 19, 2)),)),
       scale=5e-324),
    _c("valuelab.lab.policy.count_good", count=np.float32(-1.6486105e16), length=O("numpy", (T((3,), "int64", (20, 19, 2)),)),
       scale=5e-324)]
REGRESSIONS["valuelab.lab.ppo.train_many"] = [  # "'numpy.int8' object is not iterable"
    _c("valuelab.lab.ppo.train_many", jobs=np.int8(-110), seeds=[1], processes=1, device=None)]
REGRESSIONS["valuelab.integrations.torchrl.to_torchrl"] = [  # values of another dtype: a dict TorchRL's GAE refuses
    _c("valuelab.integrations.torchrl.to_torchrl", rewards=T((1, 2), F32), values=T((1, 2), "float16"),
       mask=T((1, 2), "bool", (True,)), truncated=T((1,), "bool", (True,)), bootstrap=T((1,), F32, (-3.126837968826294,)))]
REGRESSIONS["valuelab.rewards.kl_shaped_rewards"].append(  # a missing score read as a score of 0
    _c("valuelab.rewards.kl_shaped_rewards", logprobs=T((1, 2), F32), ref_logprobs=T((1, 2), F32), score=None, mask=None,
       beta=0.1, estimator="k1"))
REGRESSIONS["valuelab.lab.stats.equivalence"] = [  # OverflowError: int too large to convert to float
    _c("valuelab.lab.stats.equivalence", x=[0.1, 0.2, 0.3], margin=-(10**400), alpha=0.05)]
REGRESSIONS["valuelab.lab.transformer.final_scores"].append(  # a freed lengths reached expand: setStorage RuntimeError
    _c("valuelab.lab.transformer.final_scores", model=O("model", (dict(n_models=1, n_tokens=5, max_positions=5, d_model=3,
                                                                   n_layers=2, n_heads=1, d_ff=1),)),
       inputs=T((1, 2, 3), "int64", (4, 0, 4, 0, 4, 0)), lengths=T((2,), "int64", (2, 1), layout="freed")))
REGRESSIONS["valuelab.returns.discounted_returns"] = [  # the oracle's: gamma**2 = 0 in the doubling, 1e-300 * 1e308
    _c("valuelab.returns.discounted_returns", "valid", rewards=T((1, 3), "float64", (0.0, -3.0, 1e308), grad=True),
       mask=None, gamma=1e-300, bootstrap=None)]
REGRESSIONS["valuelab.distributed.run_on_ranks"].append(  # OverflowError from spawn
    _c("valuelab.distributed.run_on_ranks", "hostile", 3, 2**63, fn=O("fn", ("fuzz_targets.rank_echo",)), world_size=2**64))
REGRESSIONS["valuelab.integrations.trl.from_trl"].append(  # the KL term plus the moved score: +inf from finite rewards
    _c("valuelab.integrations.trl.from_trl", "extreme", rewards=T((1, 3), "float64", (1.7976931348623157e308,)),
       values=T((1, 3), "float64"), sequence_lengths=T((1,), "int64", (0,)), phantom=False))
REGRESSIONS["valuelab.integrations.openrlhf.advantages_and_returns"] = [  # the oracle's: OpenRLHF's loop fails on T = 0
    _c("valuelab.integrations.openrlhf.advantages_and_returns", "valid", values=T((2, 0), F32), rewards=T((2, 0), F32),
       action_mask=None, gamma=T((), F32, (0.0869,)), lambd=np.float64(0.9))]
REGRESSIONS["valuelab.losses.value_loss_stats"] = [  # the oracle's: EV of values 5e15 against returns spread by 3e4
    _c("valuelab.losses.value_loss_stats", "valid", values=T((1, 9), "float64", (4870256350541507.0,)),
       returns=T((1, 9), "float64", (0.0, 66000.0)), mask=None, old_values=T((1, 9), "float64"), clip_range=0.0,
       aggregation="token-mean", group=None, global_count=None)]
REGRESSIONS["valuelab.lab.policy.sample_responses"].append(  # the oracle's: a Python loop over 2.7 million rows, past 10 s
    _c("valuelab.lab.policy.sample_responses", "valid", world=O("world", (dict(n_prompts=1, vocab_size=3, max_len=2, seed=2115),)),
       probs=O("probs", (O("world", (dict(n_prompts=1, vocab_size=3, max_len=2, seed=2115),)), (1,), "ref", 0, "torch")),
       samples_per_prompt=np.int64(2718095), generators=[4678725], evaluation=None, dtype=torch.float32))
REGRESSIONS["valuelab.lab.stats.equivalence"].append(  # -np.uint64(m) wraps around: every interval "outside" the margin
    _c("valuelab.lab.stats.equivalence", "valid", x=[1.0, 0.0], margin=np.uint64(2**64 - 1), alpha=0.25))
REGRESSIONS["valuelab.lab.transformer.explained_variance"].append(  # the oracle's: a spread np.var underflows to 0
    _c("valuelab.lab.transformer.explained_variance", "valid", prediction=T((6,), "float64", (0.0, -3.062437557798362e-279, 0.0)),
       target=T((6,), "float64", (0.0, -3.062437557798362e-279, 0.0)), mask=T((6,), "bool", (True,)), dim=0))
REGRESSIONS["valuelab.lab.transformer.sequence_inputs"] = [  # an efficient zero tensor of rows reached an index op: SIGSEGV
    _c("valuelab.lab.transformer.sequence_inputs",
       world=O("world", (dict(n_prompts=1, vocab_size=4, max_len=1, eos_range=(0.5030379680689595, 0.6899331786814951),
                              seed=1886, max_count=2),)),
       batch=O("batch", (dict(n_prompts=1, vocab_size=4, max_len=1, eos_range=(0.5030379680689595, 0.6899331786814951),
                              seed=1886, max_count=2), 2, 1, 362)),
       rows=T((1, 4), "int64", (1,), layout="zero"))]
REGRESSIONS["valuelab.distributed.batch_statistics"].append(  # clip_range=None read as "no clip", where a number is due
    _c("valuelab.distributed.batch_statistics", values=T((1, 2), F32, (2.43, -0.0)), returns=T((1, 2), F32, (0.08, 4.0)),
       old=T((1, 2), F32, (0.0, 3.33)), mask=T((1, 2), "bool", (True,)), group=None, clip_range=None))
REGRESSIONS["valuelab.losses.masked_whiten"].append(  # equal entries of 4.7e287: the mean's rounding whitened to +-1
    _c("valuelab.losses.masked_whiten", "valid", x=T((1, 40), "float64", (-4.685957499849568e+287,)),
       mask=T((1, 40), "bool", (True, True, False)), shift_mean=True, eps=1e-8, group=None, unbiased=True))
REGRESSIONS["valuelab.integrations.verl.whiten"].append(  # the oracle's: a variance of 2.4e-322 is subnormal
    _c("valuelab.integrations.verl.whiten", "valid", values=T((1, 3), "float64", (-2.213478242430025e-161,
                                                                                 -1.6136471333081161e-198, -2.2e-161)),
       mask=T((1, 3), "bool", (True, True, False)), eps=0.0))
REGRESSIONS["valuelab.losses.masked_var"] = [  # the oracle's: two sums of squares, each off by up to n eps
    _c("valuelab.losses.masked_var", "valid", x=T((1, 2), "float64", (-2.25, -2.3125)), mask=T((1, 2), "bool", (True,)),
       unbiased=False, group=None)]
REGRESSIONS["valuelab.lab.ppo.advantage_fit"] = [  # the oracle's: mask None is documented (every token before t_max)
    _c("valuelab.lab.ppo.advantage_fit", "valid", estimate=T((7,), "float64", (0.0, 0.7, 4.6e-33, -0.034)),
       exact=T((7,), "float64", (3.81, 1.01, -3.77, 2.76, 0.31, -1.0, 1e-6)), mask=None, t_max=9)]
REGRESSIONS["valuelab.integrations.verl.whiten"].append(  # verl's masked_whiten has no default mask: None refused
    _c("valuelab.integrations.verl.whiten", values=T((7,), "float64", (3.5, -0.0, -0.79)), mask=None, eps=1e-8))
REGRESSIONS["valuelab.losses.aggregate"].append(  # a required mask: None is not "every token"
    _c("valuelab.losses.aggregate", per_token=T((1, 2), F32), mask=None, aggregation="token-mean"))
REGRESSIONS["valuelab.losses.masked_var"].append(  # the oracle's: it scaled by max|x|, not a power of two, and rounded
    _c("valuelab.losses.masked_var", "valid", x=T((1, 2), "float64", (1.4397951364517212, 1.4397951389470336)),
       mask=T((1, 2), "bool", (True,)), unbiased=False, group=None))
REGRESSIONS["valuelab.losses.value_loss_stats"].append(  # the oracle's: an EV of -3e76 does not fit float32: refused
    _c("valuelab.losses.value_loss_stats", "valid", values=T((2,), F32, (1e-5, 2.0818307399749756)),
       returns=T((2,), F32, (0.0, 1.1754943508222875e-38)), mask=None, old_values=T((2,), F32), clip_range=0.2,
       aggregation="seq-mean-token-mean", group=None, global_count=None))
REGRESSIONS["valuelab.distributed.batch_statistics"] += [  # the oracle's: an EV past float32; a spread of 2.2e-308
    _c("valuelab.distributed.batch_statistics", "valid", values=T((1, 3), F32, (4.0, -1.1920928955078125e-07, 4.0)),
       returns=T((1, 3), F32, (-1.0428320912418572e-20, 0.0, 0.19355377554893494)),
       old=T((1, 3), F32, (-1.0428320912418572e-20, 0.0, 0.19355377554893494)),
       mask=T((1, 3), "bool", (True, True, False)), group=None, clip_range=1.0),
    _c("valuelab.distributed.batch_statistics", "valid", values=T((1, 2), "float64", (0.0, 2.2e-308)),
       returns=T((1, 2), "float64", (0.0, 2.2e-308)), old=T((1, 2), "float64", (0.0, -2.4172301292419434)),
       mask=T((1, 2), "bool", (True,)), group=None, clip_range=0.2)]
REGRESSIONS["valuelab.integrations.verl.compute_gae_advantage_return"].append(  # verl's response_mask has no default
    _c("valuelab.integrations.verl.compute_gae_advantage_return", token_level_rewards=T((1, 3), F32), values=T((1, 3), F32),
       response_mask=None, gamma=1.0, lam=0.95))
REGRESSIONS["valuelab.losses.masked_whiten"].append(  # the oracle's: s * s underflows to 0 for s = 2**-997
    _c("valuelab.losses.masked_whiten", "valid", x=T((2, 1), "float64", (1e-300,)), mask=T((2, 1), "bool", (True,)),
       shift_mean=False, eps=0, group=None, unbiased=True))
REGRESSIONS["valuelab.integrations.verl.whiten"].append(  # the oracle's: eps / (s * s) with s * s = 0
    _c("valuelab.integrations.verl.whiten", "valid", values=T((4, 2), "float64", (2.2e-308,)),
       mask=T((4, 2), "bool", (True, True, False, True)), eps=1e-8))
REGRESSIONS["valuelab.lab.ppo.policy_loss"].append(  # the oracle's: exp(1e-8) is 1 in float32, a tie at clip_range 0
    _c("valuelab.lab.ppo.policy_loss", "valid", logprobs=T((1, 3), F32), old_logprobs=T((1, 3), F32, (9.99999993922529e-09,)),
       advantages=T((1, 3), F32), mask=None, clip_range=0.0, aggregation="token-mean"))
REGRESSIONS["valuelab.lab.transformer.explained_variance"].append(  # the oracle's: an EV of -1e53 does not fit float32
    _c("valuelab.lab.transformer.explained_variance", "valid",
       prediction=T((6,), F32, (-0.0, 2.51, 5.96e-08, -3.36, 6.2e-19, -3.30)),
       target=T((6,), F32, (0.0, -3.606219079947546e-27)), mask=T((6,), "bool", (True,)), dim=-1))
REGRESSIONS["valuelab.distributed.run_on_ranks"].append(  # more ranks than cores: refused, not forked
    _c("valuelab.distributed.run_on_ranks", "hostile", [1, 1], 0, fn=O("fn", ("valuelab.distributed.shard_statistics",)),
       world_size=np.int8(127)))
REGRESSIONS["valuelab.integrations._conventions.zero_holes"] = [  # None read as "no holes"
    _c("valuelab.integrations._conventions.zero_holes", x=T((3,), "float16"), mask=None)]
REGRESSIONS["valuelab.distributed.run_on_ranks"].append(  # an error inside a rank: ProcessRaisedException
    _c("valuelab.distributed.run_on_ranks", "hostile", [2, 3], "token-mean",
       fn=O("fn", ("valuelab.distributed.shard_statistics",)), world_size=2))
REGRESSIONS["valuelab.distributed.demo_batch"] += [  # 137 GB asked of the allocator; a size no float holds
    _c("valuelab.distributed.demo_batch", seed=0, rows=2**31, length=8),
    _c("valuelab.distributed.demo_batch", seed=0, rows=10**400, length=8)]
REGRESSIONS["valuelab.distributed.batch_statistics"] += [  # "x: its variance exceeds": masked_var's name, not this one's
    _c("valuelab.distributed.batch_statistics", "extreme", values=T((1, 3), F32, (2.5, 1e-300, 2.5)),
       returns=T((1, 3), F32, (-7.171162270402517e+16, -3.1073164121628964e+16, 3.4e+38)), old=T((1, 3), F32, (-2.7,)),
       mask=T((1, 3), "bool", (True,)), group=None, clip_range=0.2),
    # a tie in float32 between the clipped and unclipped squared errors: either branch's gradient is right
    _c("valuelab.distributed.batch_statistics", "valid", values=T((1, 6), F32, (-3.921851634979248,)),
       returns=T((1, 6), F32, (-2082734475649441.0, -3.921851634979248, -2082734475649441.0, -3.3943231105804443,
                               -2082734475649441.0, -3.921851634979248)),
       old=T((1, 6), F32, (-0.0, -3.921851634979248)), mask=T((1, 6), "bool", (True,)), group=None, clip_range=0.2)]
REGRESSIONS["valuelab.distributed.batch_statistics"].append(  # a masked return of 1e308: 0 * inf = NaN in the gradient
    _c("valuelab.distributed.batch_statistics", "extreme", values=T((1, 3), "float64", (0.0,)),
       returns=T((1, 3), "float64", (0.0, 1.0, 1e308)), old=T((1, 3), "float64", (0.0,)),
       mask=T((1, 3), "bool", (True, True, False)), group=None, clip_range=0.2))
REGRESSIONS["valuelab.lab.transformer.explained_variance"].append(  # equal targets of 1.77e16: an ulp of spread from the mean
    _c("valuelab.lab.transformer.explained_variance", "valid", prediction=T((6,), "float64", (1.7736693088322292e+16,)),
       target=T((6,), "float64", (1.7736693088322292e+16,)), mask=T((6,), "bool", (True,)), dim=0))
REGRESSIONS["valuelab.integrations.verl.compute_gae_advantage_return"] = REGRESSIONS.get(
    "valuelab.integrations.verl.compute_gae_advantage_return", []) + [  # the oracle's: a spread below float32's rounding
    _c("valuelab.integrations.verl.compute_gae_advantage_return", "extreme",
       token_level_rewards=T((2, 3), F32, (65504.0,)),
       values=T((2, 3), F32, (9090588527007092.0, 9090588527007092.0, 65504.0, 65504.0, 9090588527007092.0,
                               9090588527007092.0)),
       response_mask=T((2, 3), "bool", (True, True, False, False, True, False)), gamma=1, lam=1)]
REGRESSIONS["valuelab.lab.policy.sample_responses"] = REGRESSIONS.get("valuelab.lab.policy.sample_responses", []) + [
    # the oracle's: 9 * np.int8(34) rows wrapped around to 50 in its own int8 arithmetic
    _c("valuelab.lab.policy.sample_responses", "hostile",
       world=O("world", (dict(n_prompts=3, vocab_size=3, max_len=4, eos_range=(0.14581842197392628, 0.9101148229678759),
                              beta=0.0, gamma=0.0, logit_scale=0.0, seed=242436, max_count=5),)),
       probs=O("probs", (O("world", (dict(n_prompts=3, vocab_size=3, max_len=4, eos_range=(0.14581842197392628, 0.9101148229678759),
                                          beta=0.0, gamma=0.0, logit_scale=0.0, seed=242436, max_count=5),)),
                         (3,), "ref", 27761, "torch32")),
       samples_per_prompt=np.int8(34), generators=[np.int64(303), 2104, np.int64(6768974)], evaluation=None,
       dtype=torch.float32)]
REGRESSIONS["valuelab.lab.stats.paired_ci"] = REGRESSIONS.get("valuelab.lab.stats.paired_ci", []) + [  # a meta tensor in the list
    _c("valuelab.lab.stats.paired_ci", "hostile", a=[0.5, torch.tensor(2, dtype=torch.int16, device="meta"), 1.5],
       b=[1.0, 2.0, 3.0], level=0.95)]
REGRESSIONS["valuelab.distributed.shard_statistics"] = REGRESSIONS.get("valuelab.distributed.shard_statistics", []) + [
    # a freed tensor as sizes: the error message read its data (SIGSEGV)
    _c("valuelab.distributed.shard_statistics", "hostile", rank=0, world_size=2,
       sizes=T((3,), F32, (0.0,), "freed"), seed=293)]
