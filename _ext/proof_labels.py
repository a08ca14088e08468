"""Sphinx extension (listed in _config.yml): sphinx-proof's LaTeX labels for a document whose title has an apostrophe.

sphinx-proof labels a proposition in LaTeX as ``<docname>:<label>`` and
finds the docname by matching the document's title against its section's
names; after Sphinx's smart quotes the title of chapter 15 ("SmolLM2-135M's
critic ...") no longer matches, the docname comes back ``None`` and every
reference to ``prop-ev-ceiling`` in the PDF is undefined. Where that match
fails, the docname is read from the nearest enclosing node that carries one
(the ``start_of_file`` node the LaTeX builder wraps each document in).
"""

from __future__ import annotations


def _patch() -> None:
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


def setup(app):
    _patch()
    return {"parallel_read_safe": True, "parallel_write_safe": True}
