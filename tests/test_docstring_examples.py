"""Issue 26: the three-line example in each estimator's docstring (the API page shows it) runs as written."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["valuelab.returns", "valuelab.advantages", "valuelab.rewards", "valuelab.losses", "valuelab.packed"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    mod = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    tests = [t for t in finder.find(mod, name, globs={}) if t.examples]
    assert tests, f"{name}: no docstring example"
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    for t in tests:
        runner.run(t)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} docstring examples failed"


def test_conventions_are_filled_in_and_a_missing_placeholder_is_refused():
    import valuelab as vl
    from valuelab._engine.docs import padded_conventions

    for fn in (vl.td_errors, vl.gae, vl.decoupled_gae, vl.td_targets, vl.nstep_returns):
        assert "{conventions}" not in fn.__doc__ and "Conventions: ``values[..., t]``" in fn.__doc__, fn.__name__

    def no_placeholder():
        """A docstring that forgot the line."""

    with pytest.raises(ValueError, match="no_placeholder"):
        padded_conventions("the returns")(no_placeholder)


def test_book_style_is_read_only():
    import valuelab as vl

    with pytest.raises(TypeError):
        vl.BOOK_STYLE["font.size"] = 6
