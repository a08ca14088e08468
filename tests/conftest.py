import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
# The long run of the property-based suite (`make fuzz`, tests/test_fuzz.py): 2,500 examples per cheap function, at
# least 100,000 in all (the session prints the count). Random, not derandomized: each run explores new inputs.
settings.register_profile(
    "fuzz", max_examples=2500, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=False,
    print_blob=True,
)
# A medium run, to collect findings (about 15,000 examples in all, random; with FUZZ_SURVEY=1, see tests/test_fuzz.py).
settings.register_profile(
    "fuzz-medium", max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=False,
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The property-based suite (tests/test_fuzz.py) runs in `make test` with the profile "ci" (fixed examples, about
# 15,000 calls) and in `make fuzz` with "fuzz" (random, at least 100,000). VALUELAB_FUZZ=0 leaves it out (a quick
# local run of the other tests).
collect_ignore = ["test_fuzz.py"] if os.environ.get("VALUELAB_FUZZ") == "0" else []


def pytest_terminal_summary(terminalreporter):
    """The number of examples the property-based suite ran (tests/test_fuzz.py), when it ran."""
    import sys

    fuzz = sys.modules.get("test_fuzz")
    if fuzz is not None and fuzz.COUNTER["examples"]:
        c = fuzz.COUNTER
        terminalreporter.write_line(
            f"fuzz: {c['examples']} examples run ({c['failures']} failed), profile "
            f"{os.environ.get('HYPOTHESIS_PROFILE', 'ci')}, worker restarts {fuzz._WORKER.restarts}"
        )



import contextlib

import pytest

from valuelab._engine import native as _native

CPU_PATHS = ["c-kernel", "pytorch"]


def cpu_path_context(path: str):
    """The context in which CPU GAE takes ``path``: the C kernel (the default) or the PyTorch block scan."""
    if path == "c-kernel":
        if not _native.available():
            pytest.skip(f"C kernel not available here: {_native.status()}")
        return contextlib.nullcontext()
    return _native.disabled()


@pytest.fixture(params=CPU_PATHS)
def cpu_path(request):
    """Runs a test once on each CPU path of the fused estimators (valuelab._engine.native, valuelab._engine.fastscan)."""
    with cpu_path_context(request.param):
        yield request.param
