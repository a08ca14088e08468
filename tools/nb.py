"""Author chapters as jupytext percent scripts, store them as executed notebooks.

    python tools/nb.py build src.py chapters/NN_name.ipynb   # convert + execute in a fresh kernel
    python tools/nb.py execute chapters/NN_name.ipynb        # re-execute in place

Needs `pip install jupytext` (an authoring tool only; readers and CI do not need it).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat

KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}


def execute(path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute", "--inplace",
         "--ExecutePreprocessor.timeout=600", str(path)],
        capture_output=True, text=True,
    )
    if res.returncode:
        err = res.stderr
        start = err.find("An error occurred while executing")
        sys.exit(f"{path}: execution failed\n" + (err[start:start + 4000] if start >= 0 else err[-4000:]))


def build(src: Path, dst: Path) -> None:
    import jupytext

    nb = jupytext.read(src)
    nb.metadata = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    if "accelerator" in src.read_text()[:2000]:
        nb.metadata["accelerator"] = "GPU"
        nb.metadata["colab"] = {"provenance": [], "gpuType": "T4"}
    nbformat.write(nb, dst)
    execute(dst)


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "build":
        build(Path(args[0]), Path(args[1]))
    elif cmd == "execute":
        for a in args:
            execute(Path(a))
    else:
        raise SystemExit(__doc__)
