"""``python -m valuelab info``: the versions, and which path CPU GAE takes on this machine (chapter 9, "One pass in C").

Prints the valuelab and torch versions, the CPU path in use
(:func:`valuelab._engine.native.status`: the C kernel and the code it runs, or the
PyTorch block scan and why), the file the kernel was loaded from, and the
vector width W per dtype of the kernel this CPU runs (:func:`valuelab._engine.native.lanes`,
the W of :eq:`eq-fast-vector-scan`). Exits 0 whichever path it is.
"""

from __future__ import annotations

import argparse
import platform
import sys
from typing import List, Optional

import torch

from . import __version__
from ._engine import native as _native


def info() -> str:
    """The report of ``python -m valuelab info``, one ``name: value`` line each."""
    path = _native.library_path()
    lines = [
        f"valuelab: {__version__}",
        f"torch: {torch.__version__}",
        f"python: {platform.python_version()} ({platform.machine()})",
        f"CPU path: {_native.status()}",
        f"library: {path if path is not None else 'none loaded'}",
    ]
    widths = _native.lanes()
    if widths is None:
        return "\n".join(lines + ["vector width: none (the C kernel is not loaded)"])
    for dtype, w in widths.items():
        size = torch.tensor([], dtype=dtype).element_size()
        lines.append(f"vector width {str(dtype).replace('torch.', '')}: {w} lanes ({w * size} bytes)")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    """The command line: ``info`` is the one command."""
    parser = argparse.ArgumentParser(prog="python -m valuelab", description="valuelab's command line")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="versions, the CPU path in use, the kernel library and its vector widths")
    args = parser.parse_args(argv)
    if args.command == "info":
        print(info())
    return 0


if __name__ == "__main__":
    sys.exit(main())
