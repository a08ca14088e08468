"""Sphinx extension (listed in _config.yml): typeset the book's math offline when a local MathJax is present.

If the npm package ``mathjax@3`` has been installed into
``.cache/node_modules`` (``make mathjax``), the HTML build serves that copy
from ``_static/mathjax/`` and points ``mathjax_path`` at it, so every page
typesets its formulas with no network (a reader who opens ``_build/html``
offline, or a machine behind a firewall). Without it the build keeps
Sphinx's default, MathJax from a CDN, and says so once.

Set ``VALUELAB_MATHJAX=cdn`` to force the CDN (e.g. for a smaller site).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from sphinx.util import logging

LOG = logging.getLogger(__name__)
LOCAL = Path(__file__).resolve().parents[1] / ".cache" / "node_modules" / "mathjax" / "es5"
ENTRY = "tex-chtml.js"


def local_mathjax() -> Path | None:
    """The local MathJax folder when it is usable (and not switched off), else None."""
    if os.environ.get("VALUELAB_MATHJAX", "").lower() == "cdn":
        return None
    return LOCAL if (LOCAL / ENTRY).is_file() else None


def _configure(app, config) -> None:
    if app.builder.format != "html":
        return
    if local_mathjax() is None:
        LOG.info("offline_mathjax: no local MathJax (make mathjax); the pages load MathJax from a CDN")
        return
    config.mathjax_path = f"mathjax/{ENTRY}"  # relative: served from _static/


def _copy(app, exception) -> None:
    src = local_mathjax()
    if exception is not None or src is None or app.builder.format != "html":
        return
    shutil.copytree(src, Path(app.outdir) / "_static" / "mathjax", dirs_exist_ok=True)


def setup(app):
    app.connect("builder-inited", lambda a: _configure(a, a.config))
    app.connect("build-finished", _copy)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
