"""Time builds of the C kernel against each other: nanoseconds per token, one thread, data in the caches.

    python tools/kernel_widths.py                       # this checkout's kernel at each vector width
    python tools/kernel_widths.py --before 0464cc9      # ... and that commit's kernel, built for the same targets

Each build is compiled with setup.py's flags into a temporary folder and
loaded through ctypes (a tool, not the library: the library never compiles
at run time). A build is named by the flags that pick its vector width:
``-DVALUELAB_MAX_VECTOR=32`` (the AVX2 kernel) and ``-DVALUELAB_NO_CLONES``
(the 16-byte baseline); for a commit before the per-width kernels (chapter 9,
"One pass in C"), ``-DVALUELAB_TARGETS='"avx2","default"'`` and
``-DVALUELAB_NO_CLONES`` build its one 64-byte-vector kernel for those
targets. The calls are interleaved, round by round, and the minimum per
build is reported, with the load average before and after.
"""

from __future__ import annotations

import argparse
import ast
import ctypes
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "lib/valuelab/_engine/_gae_kernel.c"
ARGTYPES = [ctypes.c_void_p] * 6 + [ctypes.c_int64, ctypes.c_int64, ctypes.c_double, ctypes.c_double,
                                    ctypes.c_int, ctypes.c_int]
NEW_BUILDS = {"widest": [], "32-byte": ["-DVALUELAB_MAX_VECTOR=32"], "16-byte": ["-DVALUELAB_NO_CLONES"]}
OLD_BUILDS = {"widest": [], "avx2 clone": ['-DVALUELAB_TARGETS="avx2","default"'],
              "single target": ["-DVALUELAB_NO_CLONES"]}


def setup_flags() -> List[str]:
    """``FLAGS`` of setup.py, read without running it."""
    for node in ast.parse((ROOT / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "FLAGS":
            return ast.literal_eval(node.value)
    raise SystemExit("setup.py has no FLAGS")


def build(source: Path, flags: List[str], out: Path) -> Tuple[Callable[..., int], str]:
    cmd = ["gcc", *setup_flags(), "-fPIC", "-shared", *flags, "-o", str(out), str(source)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    lib = ctypes.CDLL(str(out))
    fn = lib.valuelab_scan
    fn.restype, fn.argtypes = ctypes.c_int, ARGTYPES
    lib.valuelab_target.restype = ctypes.c_char_p
    return fn, lib.valuelab_target().decode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", help="a git commit whose kernel is timed too")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=31)
    args = ap.parse_args()
    torch.set_num_threads(1)
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        sources = {"this checkout": (ROOT / SOURCE, NEW_BUILDS)}
        if args.before:
            old = Path(tmp) / "before.c"
            old.write_text(subprocess.run(["git", "show", f"{args.before}:{SOURCE}"], cwd=ROOT, check=True,
                                          capture_output=True, text=True).stdout)
            sources[args.before] = (old, OLD_BUILDS)
        fns: Dict[str, Callable[..., int]] = {}
        for where, (src, builds) in sources.items():
            for name, flags in builds.items():
                fn, target = build(src, flags, Path(tmp) / f"{len(fns)}.so")
                fns[f"{where}, {name} ({target})"] = fn
        B, T = args.rows, args.tokens
        gen = torch.Generator().manual_seed(0)
        for dtype in (torch.float32, torch.float64):
            r, v = (torch.randn(B, T, generator=gen, dtype=dtype) for _ in range(2))
            a, g = torch.empty_like(r), torch.empty_like(r)
            call = (r.data_ptr(), v.data_ptr(), None, None, a.data_ptr(), g.data_ptr(), B, T, 0.99, 0.99 * 0.95,
                    int(dtype == torch.float64), 1)
            reps = max(1, 2_000_000 // (B * T))
            best = dict.fromkeys(fns, float("inf"))
            for _ in range(args.rounds):
                for name, fn in fns.items():
                    t0 = time.perf_counter()
                    for _ in range(reps):
                        fn(*call)
                    best[name] = min(best[name], (time.perf_counter() - t0) / reps)
            for name, s in best.items():
                print(f"{str(dtype).replace('torch.', ''):8s} {s * 1e9 / (B * T):7.3f} ns/token  {name}")
    print(f"{B} x {T} tokens, one thread, minimum of {args.rounds} interleaved rounds; "
          f"load {load0:.2f} -> {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    sys.exit(main())
