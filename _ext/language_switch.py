"""Sphinx extension (listed in _config.yml): a link on every page to the same page, same section, in the book's other language.

The English book is built into ``_build/html`` and the Chinese one
(``tools/zh.py build``, then ``zh/``) into ``_build/html/zh``; the page
``chapters/05_gae.html`` of one is the page of the same name in the other.
Each page gets a ``<meta name="valuelab-other-language">`` with the other
page's relative address and the link's label, and
``_static/language_switch.js`` (loaded by jupyter-book with every file in ``_static``) puts the link at the top of the article. A
click carries the section the reader is in (its position among the page's
sections, the same in both languages since a translation keeps every
heading), and the page that opens scrolls to that section.

Configuration (``_config.yml``, ``sphinx.config``)::

    language_switch: {"prefix": "zh/", "label": "中文", "lang": "zh-CN"}

``prefix`` is the other book's root seen from this book's root (``../``
from the Chinese book).
"""

from __future__ import annotations

import html
from typing import Any, Dict


def _page(app, pagename: str, templatename: str, context: Dict[str, Any], doctree) -> None:
    conf = app.config.language_switch or {}
    if not conf or app.builder.format != "html":
        return
    href = "../" * pagename.count("/") + conf["prefix"] + pagename + ".html"
    meta = (f'<meta name="valuelab-other-language" content="{html.escape(href)}" '
            f'data-label="{html.escape(conf["label"])}" data-lang="{html.escape(conf.get("lang", ""))}">\n')
    context["metatags"] = context.get("metatags", "") + meta


def setup(app):
    app.add_config_value("language_switch", {}, "html")
    app.connect("html-page-context", _page)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
