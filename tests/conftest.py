import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))



import contextlib

import pytest

from valuelab import _native

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
    """Runs a test once on each CPU path of the fused estimators (valuelab._native, valuelab._fastscan)."""
    with cpu_path_context(request.param):
        yield request.param
