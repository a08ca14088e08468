"""Sphinx extension (listed in _config.yml): the reference list labelled as the text cites, author and year.

The chapters cite author-year (``bibtex_reference_style: author_year``:
"Ouyang et al., 2022"), but pybtex's default styles label the list itself
with alpha keys such as ``[OWJ+22]``. This registers a pybtex style,
``authoryear``, whose labels are "Ouyang et al., 2022" (one author:
"Baird, 1995"; two: "Hillis and Steele, 1986"), so the list and the text
read the same. ``bibtex_default_style: authoryear`` selects it.

An entry with ``eprint = {2006.05990}`` (and ``archivePrefix = {arXiv}``,
or no prefix) ends with a link ``arXiv:2006.05990`` to
``https://arxiv.org/abs/2006.05990``. An eprint of another archive is
printed as ``Prefix:id``, unlinked, rather than sent to arXiv.
"""

from __future__ import annotations

from pybtex.plugin import register_plugin
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle
from pybtex.style.template import field, href, join, node


def _last_name(person) -> str:
    return " ".join(person.prelast_names + person.last_names).replace("{", "").replace("}", "")


class AuthorYearLabels(BaseLabelStyle):
    """Labels "Last, YYYY", "Last and Other, YYYY" or "Last et al., YYYY"."""

    def format_labels(self, sorted_entries):
        for entry in sorted_entries:
            people = entry.persons.get("author") or entry.persons.get("editor") or []
            names = [_last_name(p) for p in people]
            if not names:
                who = entry.fields.get("organization", entry.key)
            elif len(names) == 1:
                who = names[0]
            elif len(names) == 2:
                who = f"{names[0]} and {names[1]}"
            else:
                who = f"{names[0]} et al."
            yield f"{who}, {entry.fields.get('year', 'n.d.')}"


class AuthorYearStyle(UnsrtStyle):
    """pybtex's unsrt formatting, sorted by author and year, labelled by :class:`AuthorYearLabels`."""

    default_label_style = "authoryear"
    default_sorting_style = "author_year_title"

    def format_eprint(self, e):
        """``arXiv:<id>`` linked to its abstract page; another archive's id as plain ``Prefix:id``."""
        return _eprint


@node
def _eprint(children, data):
    """The eprint reference of ``data["entry"]``: an arXiv link unless ``archivePrefix`` names another archive."""
    entry = data["entry"]
    prefix = entry.fields.get("archivePrefix", entry.fields.get("eprinttype", "arXiv"))
    if prefix.lower() == "arxiv":
        url = join["https://arxiv.org/abs/", field("eprint", raw=True)]
        return href(url)[join["arXiv:", field("eprint", raw=True)]].format_data(data)
    return join[prefix, ":", field("eprint", raw=True)].format_data(data)


def setup(app):
    register_plugin("pybtex.style.labels", "authoryear", AuthorYearLabels)
    register_plugin("pybtex.style.formatting", "authoryear", AuthorYearStyle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
