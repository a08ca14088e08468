"""Sphinx extension (listed in _config.yml): the PDF (``make pdf``) numbered as the web pages are.

Two fixes for the LaTeX builder, neither of which touches the HTML:

* **Numbers.** On the web a chapter's equations and figures are numbered
  by the chapter's number in the book ((5.1) in chapter 5); in LaTeX every
  document before chapter 1 (the introduction's sections, the notation page)
  is a chapter too, which would make chapter 5's first equation (12.1). Each
  chapter file ``chapters/NN_*`` sets LaTeX's chapter counter to NN - 1
  before its title, and the appendix ``chapters/A1_*`` numbers its
  equations (1), (2), ... as its web page does.
* **Proposition labels.** sphinx-proof labels a proposition in LaTeX as
  ``<docname>:<label>`` and finds the docname by matching the document's
  title against its section's names; after Sphinx's smart quotes the title
  of chapter 15 ("SmolLM2-135M's critic ...") no longer matches, and the
  docname came back ``None`` (every reference to ``prop-ev-ceiling`` then
  undefined). Where that match fails, the docname is read from the nearest
  enclosing node that carries one (the ``start_of_file`` node the LaTeX
  builder wraps each document in).
"""

from __future__ import annotations

import re

from sphinx.writers.latex import LaTeXTranslator

CHAPTER = re.compile(r"^chapters/(\d+)_")
APPENDIX = re.compile(r"^chapters/A\d+_")


class NumberedTranslator(LaTeXTranslator):
    """Sphinx's LaTeX translator, with each chapter file numbered as in the book."""

    def visit_start_of_file(self, node) -> None:
        super().visit_start_of_file(node)
        m = CHAPTER.match(node["docname"])
        if m:
            self.body.append(r"\setcounter{chapter}{%d}" % (int(m.group(1)) - 1) + "\n")
        elif APPENDIX.match(node["docname"]):
            self.body.append(r"\renewcommand{\theequation}{\arabic{equation}}" + "\n")


def _patch_proof_labels() -> None:
    import sphinx_proof.nodes as proof_nodes

    if getattr(proof_nodes.find_parent, "_valuelab", False):
        return
    original = proof_nodes.find_parent

    def find_parent(env, node, parent_tag):
        found = original(env, node, parent_tag)
        if found is not None:
            return found
        while node is not None:
            if node.attributes.get("docname"):
                return node.attributes["docname"]
            node = node.parent
        return None

    find_parent._valuelab = True
    proof_nodes.find_parent = find_parent


def _use_numbered_translator(app) -> None:
    # registered for a LaTeX build only: pydata-sphinx-theme (under the book theme) gives the HTML translator its
    # scrollable tables only when no translator is registered at all, so a registration in an HTML build would
    # take the phone pages' sideways scrolling of wide tables away
    if app.builder.format == "latex":
        app.set_translator(app.builder.name, NumberedTranslator, override=True)


def setup(app):
    _patch_proof_labels()
    app.connect("builder-inited", _use_numbered_translator)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
