"""``python -m valuelab.bench``: the GAE benchmark's command line, kept where it was (chapter 9).

The benchmark lives in the laboratory, :mod:`valuelab.lab.bench`; this entry
point only runs its ``main`` (``python -m valuelab.bench`` is the same).
Importing this module loads nothing: the laboratory is imported when the
command runs.
"""

from __future__ import annotations

import sys


def main() -> int:
    """Run :func:`valuelab.lab.bench.main` with this process's arguments; exit status 0."""
    from .lab.bench import main as bench_main

    bench_main(sys.argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
