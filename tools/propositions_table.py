"""Write the table of propositions and their status into intro.md (after the PROPOSITIONS TABLE marker).

Run ``python tools/propositions_table.py`` after adding or changing a
proposition; ``tests/test_notebooks.py`` checks that the table and the
chapters agree.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_notebooks import CHAPTERS, KIND, STATUS, proposition_blocks  # noqa: E402

MARKER = "<!-- PROPOSITIONS TABLE: generated from the chapters; tests/test_notebooks.py checks it. -->"


def rows() -> list[str]:
    out = []
    for path in CHAPTERS:
        nb = json.loads(path.read_text(encoding="utf-8"))
        first = "".join(nb["cells"][0]["source"])
        chapter = re.match(r"\((ch-[\w-]+)\)=", first).group(1)
        for cell in nb["cells"]:
            if cell["cell_type"] != "markdown":
                continue
            src = "".join(cell["source"])
            for label, _, body in proposition_blocks(src):
                m = STATUS.match(body.strip().split("\n\n")[-1].strip())
                kind = KIND[m.group(1)] if m else "MISSING"
                out.append(f"| {{ref}}`{chapter}` | {{prf:ref}}`{label}` | {kind} |")
    return out


def main() -> None:
    intro = ROOT / "intro.md"
    text = intro.read_text(encoding="utf-8")
    head = text[: text.index(MARKER) + len(MARKER)]
    table = ["", "| Chapter | Proposition | Evidence |", "|---|---|---|", *rows()]
    intro.write_text(head + "\n" + "\n".join(table) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
