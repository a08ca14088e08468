"""Build valuelab's CPU kernel, ``lib/valuelab/_engine/_gae_kernel.c``, when the package is installed.

The metadata lives in ``pyproject.toml``; this file only declares the kernel
as a setuptools extension, ``valuelab._engine._gae_kernel`` (the shared library
``valuelab/_engine/_gae_kernel<EXT_SUFFIX>``, which ``valuelab/_engine/native.py`` loads
through ctypes; chapter 9, "One pass in C"). The extension is *optional*:
where no C compiler works, ``pip install`` still succeeds, with a warning,
and the CPU then takes the PyTorch block scan.

The build is portable: no ``-march=native``, since the built file may run
on another CPU. On x86-64 the kernel is compiled once per vector width
(64, 32 and 16 bytes: AVX-512, AVX2, the baseline; target attributes in the
C file) and the widest the CPU has is picked when the library loads; where
the compiler cannot do that, the build is retried for the baseline alone.
The first try adds ``-fopenmp``, so that the kernel shares PyTorch's OpenMP
threads (the C file says how); a compiler without OpenMP gets the kernel's
own thread pool.
A build is kept only if the library then loads and computes a known
discounted return (:func:`_smoke_test`), so a compiler that writes nothing
or garbage (``CC=/bin/true``) leaves no library behind.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import stat
import sysconfig
from pathlib import Path
from typing import List

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, ExecError, PlatformError

HERE = Path(__file__).resolve().parent
SOURCE = "lib/valuelab/_engine/_gae_kernel.c"  # relative, as setuptools wants it
FLAGS = ["-O3", "-ffp-contract=fast", "-pthread", "-Wno-psabi"]  # no -march=native: see the docstring
# the first that builds and runs wins: with OpenMP (threads shared with PyTorch's libgomp), then without
# (the kernel's own pthread pool), each with a kernel per vector width, then with the baseline's alone
FALLBACK_DEFINES: List[List[str]] = [["-fopenmp"], ["-fopenmp", "-DVALUELAB_NO_CLONES"], [], ["-DVALUELAB_NO_CLONES"]]
_BUILD_ERRORS = (CCompilerError, CompileError, ExecError, PlatformError, OSError)


def _source_sha256() -> str:
    """SHA-256 of the kernel source, compiled into the library; ``_native.py`` compares it before loading."""
    return hashlib.sha256((HERE / SOURCE).read_bytes()).hexdigest()


def _smoke_test(path: str) -> None:
    """Load the built library and run ``valuelab_scan`` on one row: G = (1.75, 1.5, 1) for r = 1, γ = 1/2.

    Raises :class:`CompileError` when the file is missing, does not load,
    lacks the entry point or computes something else.
    """
    if not os.path.isfile(path):
        raise CompileError(f"the compiler wrote no library at {path}")
    try:
        fn = ctypes.CDLL(path).valuelab_scan
    except (OSError, AttributeError) as e:
        raise CompileError(f"the built library is unusable: {e}") from None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64, ctypes.c_int64, ctypes.c_double,
                                           ctypes.c_double, ctypes.c_int, ctypes.c_int]
    r = (ctypes.c_double * 3)(1.0, 1.0, 1.0)
    ret = (ctypes.c_double * 3)()
    finite = fn(ctypes.addressof(r), None, None, None, None, ctypes.addressof(ret), 1, 3, 0.5, 0.5, 1, 1)
    if finite != 1 or list(ret) != [1.75, 1.5, 1.0]:
        raise CompileError(f"the built library computes {list(ret)} (finite={finite}), not [1.75, 1.5, 1.0]")


class BuildKernel(build_ext):
    """``build_ext`` for the kernel: portable flags, a baseline retry, a smoke test, no group/world write bits."""

    def build_extension(self, ext: Extension) -> None:
        if self.compiler.compiler_type != "unix":  # GCC/Clang vector extensions: not MSVC
            raise CompileError(f"the C kernel needs GCC or Clang, not {self.compiler.compiler_type}")
        target = self.get_ext_fullpath(ext.name)
        cross = self.plat_name != sysconfig.get_platform()  # a library for another machine cannot be tried here
        errors = []
        for defines in FALLBACK_DEFINES:
            ext.extra_compile_args = FLAGS + [f'-DVALUELAB_SOURCE_SHA256="{_source_sha256()}"'] + defines
            ext.extra_link_args = ["-pthread"] + [d for d in defines if d == "-fopenmp"]
            if os.path.exists(target):
                os.unlink(target)  # also forces the rebuild (build_ext skips an up-to-date target)
            try:
                super().build_extension(ext)
                if not cross:
                    _smoke_test(target)
            except _BUILD_ERRORS as e:
                errors.append(f"{' '.join(defines) or 'default'}: {e}")
                continue
            mode = os.stat(target).st_mode
            os.chmod(target, stat.S_IMODE(mode) & ~(stat.S_IWGRP | stat.S_IWOTH))  # the loader refuses those
            return
        if os.path.exists(target):
            os.unlink(target)
        raise CompileError("valuelab's C kernel was not built (the CPU will use the PyTorch path): "
                           + "; ".join(errors))


setup(
    ext_modules=[Extension("valuelab._engine._gae_kernel", sources=[SOURCE], optional=True)],
    cmdclass={"build_ext": BuildKernel},
)
