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
