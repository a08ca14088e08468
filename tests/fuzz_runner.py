"""The worker process of the property-based suite, and the checks it runs on every call (tests/test_fuzz.py).

A hostile call may crash the process (a segfault in an index op), hang (a
loop with no bound) or try to allocate terabytes, so no call runs in the
pytest process. :class:`Worker` keeps one long-lived worker process (its own
process group, address space capped at ``FUZZ_MEMORY_GB``, default 6 GB, on a
CPU-only machine) and feeds it calls over a pipe; the worker builds the
arguments from their recipes, runs :func:`check_call` and sends back a
verdict. A worker that dies, runs past the call's time bound or spawns more
than ``MAX_PROCESSES`` processes is killed with its whole process group and
restarted; the call is a failure of its own kind.

:func:`check_call` holds the generic properties, the same for every public
function:

* it returns, or raises ``TypeError``/``ValueError`` whose message names one
  of the function's parameters (any other exception, or an error on a valid
  call, is a failure);
* it never changes its inputs (every tensor and array reachable from the
  arguments is compared, bytes and metadata, before and after);
* finite inputs never give a NaN or an inf in the result;
* the result is correct: the target's oracle (``fuzz_targets``) checks it
  against ``valuelab.lab.reference`` or an independent computation.

Run as a script, this file is the worker: ``python tests/fuzz_runner.py``.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import pickle
import re
import select
import signal
import struct
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple

HERE = Path(__file__).resolve().parent
MAX_PROCESSES = max(4, os.cpu_count() or 1) + 8
"""More processes than this in the worker's group (the worker included) is a failure: an unbounded spawn. It is
``valuelab.distributed.MAX_RANKS`` (the ranks ``run_on_ranks`` may start, one per core, at least 4) plus room for
the worker, spawn's resource tracker and a few helpers."""


class Call(NamedTuple):
    """One call of a public function: ``target(*varargs, **kwargs)`` on built recipes.

    ``mode``: ``"valid"`` (documented domain, ordinary values: must return
    a correct result), ``"extreme"`` (documented shapes and types, hostile
    values: NaN, inf, huge, subnormal) or ``"hostile"`` (one or two
    arguments replaced by anything).
    """

    target: str
    kwargs: Dict[str, Any]
    mode: str = "hostile"
    varargs: Tuple[Any, ...] = ()


# kinds of failure, each its own exception class so that hypothesis reports (and shrinks) each separately
KINDS = {
    "crash": "the process died",
    "hang": "ran past its time bound",
    "resources": "spawned too many processes",
    "exception": "raised an exception other than TypeError/ValueError",
    "message": "raised TypeError/ValueError whose message names no parameter",
    "refused": "refused a valid call",
    "mutated": "changed an input",
    "nonfinite": "returned NaN or inf from finite inputs",
    "wrong": "returned a wrong result (oracle)",
    "suite": "an error of the suite itself",
}


# ---------------------------------------------------------------------------
# walking arguments and results
# ---------------------------------------------------------------------------


def walk(x: Any, path: str = "", seen: Optional[set] = None, depth: int = 0) -> Iterator[Tuple[str, Any]]:
    """Every leaf reachable from ``x`` (tensors, arrays, numbers...), with its path; containers and objects are opened."""
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415

    seen = set() if seen is None else seen
    if depth > 6 or id(x) in seen:
        return
    if isinstance(x, (torch.Tensor, np.ndarray, np.generic, float, int, complex, str, bytes, type(None))):
        yield path, x
        return
    seen.add(id(x))
    if isinstance(x, torch.nn.Module):
        for name, p in list(x.named_parameters()) + list(x.named_buffers()):
            yield f"{path}.{name}", p
        for k, v in vars(x).items():
            if isinstance(v, (int, float, str)) and not k.startswith("_"):
                yield f"{path}.{k}", v
        return
    if isinstance(x, torch.Generator):
        return  # consumed by design (sample_responses draws from the generators it is given)
    if isinstance(x, dict):
        for k, v in x.items():
            yield from walk(v, f"{path}[{k!r}]", seen, depth + 1)
    elif isinstance(x, (list, tuple)):
        fields = getattr(x, "_fields", None)
        for i, v in enumerate(x):
            yield from walk(v, f"{path}.{fields[i]}" if fields else f"{path}[{i}]", seen, depth + 1)
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        for f in dataclasses.fields(x):
            yield from walk(getattr(x, f.name), f"{path}.{f.name}", seen, depth + 1)


def _has_data(x) -> bool:
    """Whether ``x``'s values can be read without touching freed memory (not meta, not freed, dense)."""
    import torch  # noqa: PLC0415

    if x.is_meta or x.layout != torch.strided or x.is_nested:
        return x.layout == torch.sparse_coo and not x.is_meta
    if x._is_zerotensor():
        return True
    if x.numel() == 0:
        return True
    last = x.storage_offset() + sum((k - 1) * s for k, s in zip(x.shape, x.stride()) if k)
    return (last + 1) * x.element_size() <= x.untyped_storage().nbytes()


def _tensor_state(x) -> tuple:
    import torch  # noqa: PLC0415

    meta = (tuple(x.shape), x.dtype, str(x.device), x.requires_grad, x.layout)
    if x.layout == torch.strided and not x.is_nested:
        meta += (tuple(x.stride()), x.storage_offset(), x.is_conj(), x.is_neg(), x._is_zerotensor())
        if not x.is_meta:
            meta += (x.untyped_storage().nbytes(),)
    if not _has_data(x) or x._is_zerotensor():
        return meta, None, None
    with torch.no_grad():
        y = x.detach()
        if y.layout == torch.sparse_coo:
            y = y.to_dense()
        y = y.resolve_conj().resolve_neg().clone(memory_format=torch.contiguous_format).cpu()
        grad = None if x.grad is None else x.grad.detach().clone().cpu()
    return meta, y.reshape(-1).view(torch.uint8), grad


def snapshot(args: Any) -> List[Tuple[str, Any, Any]]:
    """The state of every tensor, array and plain attribute reachable from ``args``."""
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415

    out = []
    for path, x in walk(args):
        if isinstance(x, torch.Tensor):
            out.append((path, x, _tensor_state(x)))
        elif isinstance(x, np.ndarray):
            out.append((path, x, (x.shape, x.strides, x.dtype.str, x.flags.writeable, x.tobytes())))
        elif isinstance(x, (int, float, str)):
            out.append((path, None, repr(x)))
    return out


def changed(before: List[Tuple[str, Any, Any]], args: Any) -> Optional[str]:
    """The path of the first input whose bytes or metadata changed (None: nothing changed)."""
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415

    after = {p: x for p, x in walk(args)}
    for path, obj, state in before:
        x = after.get(path, obj) if obj is None else obj
        if isinstance(x, torch.Tensor):
            now = _tensor_state(x)
            if now[0] != state[0]:
                return f"{path}: metadata {state[0]} -> {now[0]}"
            for i, what in ((1, "values"), (2, "grad")):
                a, b = state[i], now[i]
                if (a is None) != (b is None) or (a is not None and not torch.equal(a, b)):
                    return f"{path}: {what} changed"
        elif isinstance(x, np.ndarray):
            if (x.shape, x.strides, x.dtype.str, x.flags.writeable, x.tobytes()) != state:
                return f"{path}: numpy array changed"
        elif obj is None and path in after and repr(after[path]) != state:
            return f"{path}: {state} -> {after[path]!r}"
    return None


def nonfinite(x: Any, allowed: Callable[[str], bool] = lambda p: False) -> Optional[str]:
    """The path of the first NaN or inf among the numbers of ``x`` (meta tensors and ints skipped)."""
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415

    for path, v in walk(x):
        if allowed(path):
            continue
        if isinstance(v, torch.Tensor):
            if not (v.is_floating_point() or v.is_complex()) or not _has_data(v) or v._is_zerotensor():
                continue
            w = v.detach()
            if w.layout == torch.sparse_coo:
                w = w.to_dense()
            if w.numel() and not bool(torch.isfinite(w.resolve_conj().resolve_neg()).all()):
                bad = (~torch.isfinite(w.resolve_conj().resolve_neg())).nonzero()[0].tolist()
                return f"{path or 'result'}{bad} = {w[tuple(bad)].item()}"
        elif isinstance(v, np.ndarray) and v.dtype.kind in "fc":
            if not np.isfinite(v).all():
                return f"{path or 'result'} (numpy) holds {v[~np.isfinite(v)][0]}"
        elif isinstance(v, (float, complex, np.floating, np.complexfloating)) and not np.isfinite(v):
            return f"{path or 'result'} = {v}"
    return None


def names_a_parameter(message: str, names: List[str]) -> bool:
    """Whether the message starts with, or contains as a word, the name of one of the parameters."""
    return any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9_])", message) for n in names)


# ---------------------------------------------------------------------------
# one call, every property (in the worker)
# ---------------------------------------------------------------------------


def resolve(target: str) -> Callable:
    module, _, name = target.rpartition(".")
    return getattr(importlib.import_module(module), name)


def parameters(fn: Callable) -> List[str]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []


def _var_positional(fn: Callable) -> str:
    return next(p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.VAR_POSITIONAL)


def check_call(call: Call) -> Tuple[str, str, str]:
    """Run ``call`` and check every property: ``("ok", outcome, "")`` or ``("fail", kind, message)``."""
    import warnings  # noqa: PLC0415

    import fuzz_targets  # noqa: PLC0415
    from fuzz_recipes import build  # noqa: PLC0415

    spec = fuzz_targets.TARGETS[call.target]
    fn = resolve(call.target)
    try:
        kwargs = build(call.kwargs)
        varargs = build(call.varargs)
    except Exception as exc:  # a recipe that cannot be built is the suite's bug
        return "fail", "suite", f"building the arguments failed: {type(exc).__name__}: {exc}"
    inputs = (varargs, kwargs)
    try:
        before = snapshot(inputs)
        finite_in = nonfinite(inputs) is None
    except Exception as exc:
        return "fail", "suite", f"snapshot failed: {type(exc).__name__}: {exc}"
    names = parameters(fn) + list(spec.aliases)
    args, call_kwargs = list(varargs), dict(kwargs)
    if varargs:  # the parameters before *args go positionally, as a caller of fn(a, b, *args) writes them
        leading = names[: names.index(_var_positional(fn))]
        args = [call_kwargs.pop(n) for n in leading if n in call_kwargs] + args
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = fn(*args, **call_kwargs)
        raised = None
    except (TypeError, ValueError) as exc:
        raised = exc
    except spec.allowed as exc:
        raised = exc
    except BaseException as exc:  # noqa: BLE001 - any other exception is the finding
        tb = traceback.extract_tb(exc.__traceback__)
        where = f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
        text = str(exc)
        text = text if len(text) <= 600 else f"{text[:200]} [...] {text[-400:]}"  # a child's traceback ends with its error
        return "fail", "exception", f"raised {type(exc).__name__}: {text}{where}"
    what = changed(before, inputs)
    if what is not None:
        return "fail", "mutated", f"changed its input {what}" + (f" (then raised {raised!r})" if raised else "")
    if raised is not None:
        if isinstance(raised, spec.allowed):
            return "ok", "raised", type(raised).__name__
        msg = str(raised)
        if not names_a_parameter(msg, names):
            return "fail", "message", f"{type(raised).__name__}({msg[:300]!r}) names none of {names}"
        if call.mode == "valid" and spec.must_return:
            why = spec.defined(kwargs) if spec.defined else None
            if why is None:
                return "fail", "refused", f"refused a valid call: {type(raised).__name__}: {msg[:300]}"
        return "ok", "raised", type(raised).__name__
    if finite_in:
        bad = nonfinite(result, spec.nan_ok)
        if bad is not None:
            return "fail", "nonfinite", f"finite inputs, non-finite result: {bad}"
    if spec.oracle is not None:
        try:
            spec.oracle(fuzz_targets.Args(kwargs, varargs, call.mode, finite_in), result)
        except fuzz_targets.Wrong as exc:
            return "fail", "wrong", str(exc)[:1500]
        except Exception as exc:  # noqa: BLE001 - an oracle that breaks is the suite's bug
            tb = traceback.format_exc(limit=-3)
            return "fail", "suite", f"oracle failed: {type(exc).__name__}: {exc}\n{tb}"
    return "ok", "returned", ""


# ---------------------------------------------------------------------------
# the worker process and its client
# ---------------------------------------------------------------------------


def _send(f, obj: Any) -> None:
    data = pickle.dumps(obj)
    f.write(struct.pack("<Q", len(data)) + data)
    f.flush()


def _recv_exact(f, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def _recv(f) -> Any:
    (n,) = struct.unpack("<Q", _recv_exact(f, 8))
    return pickle.loads(_recv_exact(f, n))


def serve() -> None:
    """The worker's loop: read a call, check it, answer; stdout is the protocol's (prints go to stderr)."""
    import faulthandler  # noqa: PLC0415
    import resource  # noqa: PLC0415

    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    faulthandler.enable()
    import torch  # noqa: PLC0415

    if not torch.cuda.is_available():  # a capped address space: an attempt to allocate terabytes fails, not the machine
        cap = int(float(os.environ.get("FUZZ_MEMORY_GB", "6")) * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    torch.set_num_threads(1)
    import numpy  # noqa: PLC0415

    numpy.seterr(all="ignore")  # the oracles' overflow warnings are noise in the crash reports
    import fuzz_targets  # noqa: F401, PLC0415 - imported once, before the first call

    _send(out, ("ready", os.getpid()))
    inp = sys.stdin.buffer
    while True:
        try:
            call = _recv(inp)
        except EOFError:
            return
        try:
            verdict = check_call(call)
        except BaseException as exc:  # noqa: BLE001
            verdict = ("fail", "suite", f"check_call failed: {type(exc).__name__}: {exc}")
        _send(out, verdict)


class Worker:
    """The pytest side: one worker process, restarted after a crash, a hang or a runaway spawn."""

    def __init__(self) -> None:
        self.proc: Optional[subprocess.Popen] = None
        self.log = None
        self.restarts = 0

    def start(self) -> None:
        import tempfile  # noqa: PLC0415

        self.log = tempfile.TemporaryFile()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
                   OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
        self.proc = subprocess.Popen([sys.executable, "-u", str(HERE / "fuzz_runner.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, env=env, start_new_session=True)
        reply = self._wait(120.0)
        if not (isinstance(reply, tuple) and reply and reply[0] == "ready"):
            raise RuntimeError(f"the fuzz worker did not start: {reply!r}\n{self._log_tail()}")

    def stop(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait()
            self.proc = None

    def _log_tail(self, n: int = 1500) -> str:
        if self.log is None:
            return ""
        self.log.seek(0, os.SEEK_END)
        size = self.log.tell()
        self.log.seek(max(0, size - n))
        return self.log.read().decode(errors="replace")

    def _group_size(self) -> int:
        pgid = self.proc.pid
        count = 0
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat", "rb") as f:
                        fields = f.read().rsplit(b")", 1)[1].split()
                    count += int(fields[2]) == pgid
                except (OSError, IndexError, ValueError):
                    pass
        return count

    def _wait(self, timeout: float) -> Any:
        """The next message, or ``("died", code)``, ``("timeout",)``, ``("spawned", n)``."""
        end = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        next_census = time.monotonic() + 0.5
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return ("timeout",)
            ready, _, _ = select.select([fd], [], [], min(left, 0.25))
            if ready:
                try:
                    return _recv(self.proc.stdout)
                except (EOFError, pickle.UnpicklingError, struct.error):
                    self.proc.wait()
                    return ("died", self.proc.returncode)
            if time.monotonic() >= next_census:
                next_census = time.monotonic() + 0.5
                n = self._group_size()
                if n > MAX_PROCESSES:
                    return ("spawned", n)

    def run(self, call: Call, timeout: float) -> Tuple[str, str, str]:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        try:
            _send(self.proc.stdin, call)
        except (BrokenPipeError, OSError):
            self.stop()
            self.start()
            _send(self.proc.stdin, call)
        reply = self._wait(timeout)
        if reply[0] in ("ok", "fail"):
            return reply
        tail = self._log_tail()
        self.stop()
        self.restarts += 1
        if reply[0] == "died":
            code = reply[1]
            sig = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
            return "fail", "crash", f"the worker process died ({sig}); its last output:\n{tail[-1200:]}"
        if reply[0] == "spawned":
            return "fail", "resources", f"the call spawned {reply[1]} processes (more than {MAX_PROCESSES})"
        return "fail", "hang", f"no result within {timeout:g} s"


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    serve()
