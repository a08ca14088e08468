"""Planted slips for the mutation test (``tests/test_mutation.py``).

One module per chapter, ``chNN.py``, defines

* ``CHAPTER``: the notebook's file name under ``chapters/``;
* ``MUTATIONS``: a list of :class:`Slip`. Each slip is a plausible mistake --
  a dropped λ, an off-by-one limit, a wrong power -- planted in one
  construction the chapter relies on: either in the source of one code cell
  of the chapter, or in the source of one function of ``valuelab`` that the
  chapter calls;
* ``PROOFS``: for each proposition of the chapter whose status is *proved
  symbolically, in general*, the code cells that prove it in general (not
  the instance checks or numeric tables around them); other propositions a
  slip aims at may be listed too;
* optionally ``SKIP_CELLS`` (code-cell indices) with ``SKIP_WHY``: cells the
  harness does not run, for a chapter whose slow experiment comes after
  every check its slips need (nbval still runs the whole chapter).

The test runs the chapter with the slip and asserts that one of the
chapter's *own* checks (an ``assert`` in a cell at or after the planted one)
fails with an ``AssertionError``, and that the check the slip *aims at*
(``Slip.aims_at``) fails by itself on the mutated state: not a later table
or instance check that happens to stop the run first. Every general
proposition must have a slip that its own proof cells catch. A slip that no
check catches, a slip that breaks the chapter in another way (a
``NameError``: a broken slip, not a caught one), or a slip whose text no
longer occurs exactly once all fail the test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union


@dataclass(frozen=True)
class Slip:
    """One planted mistake: ``old`` -> ``new``, replacing the one occurrence of ``old``.

    ``cell`` is the 0-based index of the chapter's cell to edit, *or*
    ``function`` names a function of valuelab as ``"module:qualname"``
    (e.g. ``"valuelab.lab.symbolic:gae_closed_form"``) whose source is edited
    and re-defined in its module before the chapter runs. Exactly one of
    the two is given. ``why`` says in a few words what the slip is.

    ``aims_at`` names the check that must catch it: a proposition label
    (``"prop-gae-closed"``: one of the cells the chapter's ``PROOFS`` lists
    for it must fail on the mutated state), or the index of the one code
    cell whose check must fail.

    A library slip is planted right after the chapter's import cell, unless
    ``from_cell`` says to plant it just before that later cell: the cells
    before it then run with valuelab as written (for a slow chapter whose
    early cells do not need the slipped function to catch it, or call it
    at all).
    """

    name: str
    old: str
    new: str
    why: str
    aims_at: Union[str, int]
    cell: Optional[int] = None
    function: Optional[str] = None
    from_cell: Optional[int] = None

    def __post_init__(self) -> None:
        if (self.cell is None) == (self.function is None):
            raise ValueError(f"slip {self.name!r}: give exactly one of cell= and function=")
        if self.old == self.new:
            raise ValueError(f"slip {self.name!r}: old and new are the same text")
        if self.from_cell is not None and self.function is None:
            raise ValueError(f"slip {self.name!r}: from_cell is for a slip planted in a function")
        if isinstance(self.aims_at, str):
            if not self.aims_at.startswith("prop-"):
                raise ValueError(f"slip {self.name!r}: aims_at is a proposition label (prop-...) or a cell index")
        elif isinstance(self.aims_at, bool) or not isinstance(self.aims_at, int) or self.aims_at < 0:
            raise ValueError(f"slip {self.name!r}: aims_at is a proposition label (prop-...) or a cell index")
        elif self.cell is not None and self.aims_at < self.cell:
            raise ValueError(f"slip {self.name!r}: aims at cell {self.aims_at}, before its own cell {self.cell}")
