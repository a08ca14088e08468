"""Planted slips for the mutation test (``tests/test_mutation.py``).

One module per derivation chapter, ``chNN.py``, defines ``CHAPTER`` (the
notebook's file name under ``chapters/``) and ``MUTATIONS``: a list of
:class:`Slip`. Each slip is a plausible mistake -- a dropped λ, an
off-by-one limit, a wrong power -- planted in one construction the chapter
relies on: either in the source of one code cell of the chapter, or in the
source of one function of ``valuelab`` that the chapter calls. The test runs
the chapter with the slip and asserts that one of the chapter's *own*
checks (an ``assert`` in a cell at or after the planted one) fails with an
``AssertionError``. A slip that no check catches, a slip that breaks the
chapter in another way (a ``NameError``: a broken slip, not a caught one),
or a slip whose text no longer occurs exactly once all fail the test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Slip:
    """One planted mistake: ``old`` -> ``new``, replacing the one occurrence of ``old``.

    ``cell`` is the 0-based index of the chapter's cell to edit, *or*
    ``function`` names a function of valuelab as ``"module:qualname"``
    (e.g. ``"valuelab.symbolic:gae_closed_form"``) whose source is edited
    and re-defined in its module before the chapter runs. Exactly one of
    the two is given. ``why`` says in a few words what the slip is.
    """

    name: str
    old: str
    new: str
    why: str
    cell: Optional[int] = None
    function: Optional[str] = None

    def __post_init__(self) -> None:
        if (self.cell is None) == (self.function is None):
            raise ValueError(f"slip {self.name!r}: give exactly one of cell= and function=")
        if self.old == self.new:
            raise ValueError(f"slip {self.name!r}: old and new are the same text")
