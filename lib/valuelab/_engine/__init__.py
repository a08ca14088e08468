"""The engine: what a call to an estimator runs through. Private; for valuelab's maintainers (chapter 9).

Checks (every error names its argument), the front door that validates a call
once and picks a backend, the C kernel and its loader, the PyTorch blocked,
Toeplitz and doubling scans, the n-step sparse table, masks without argsort,
the reused workspace, and the sums across data-parallel ranks. Its names may
change between releases; code outside valuelab imports the estimators at the
top level instead.

What it must not import: the estimators (``valuelab.returns``,
``.advantages``, ...) and the laboratory (``valuelab.lab``); it imports only
itself, torch and the standard library (``tests/test_layout.py`` checks it on
the import graph). The map of its modules is in the package docstring.
"""
