"""Every Python block of README.md runs as written, in this environment, each in a fresh interpreter."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
TRAINERS = ("verl", "openrlhf", "ray")


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index, tmp_path):
    code = BLOCKS[index]
    needs = [m for m in TRAINERS if re.search(rf"\b{m}\b", code)]
    if needs and not os.environ.get("REQUIRE_PEERS"):
        import importlib.util
        missing = [m for m in needs if importlib.util.find_spec(m) is None]
        if missing:
            pytest.skip(f"needs {missing}: pip install -r requirements-trainers.txt; pip install --no-deps -r requirements-peers.txt")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"README block {index} failed:\n{code}\n--- stderr ---\n{proc.stderr[-3000:]}"
