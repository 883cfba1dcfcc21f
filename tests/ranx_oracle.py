"""ranx as the tests' reference implementation, run by the Python interpreter.

ranx (the metrics and fusions madr is checked against) is written as ~130 numba kernels that compile on first
use: on a fresh 2-core machine the three tests that call it spent ~130 s compiling them, for inputs of a few
dozen queries that the same kernels, interpreted, score in milliseconds. The oracle is ranx's Python source
either way; what these tests check is its arithmetic, not its compiled speed.

`interpreted_ranx()` imports ranx with numba's JIT off and keeps it off while the block runs (ranx builds
numba typed lists and dicts at call time, which are plain ones only then). Only ranx's kernels are affected:
madr's own numba kernels (`madr.search.sparse`) are decorated outside the block and stay compiled."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

_SUBMODULES = ("ranx", "ranx.metrics", "ranx.fusion", "ranx.normalization")


@contextlib.contextmanager
def _jit_off() -> Iterator[None]:
    import numba

    previous = numba.config.DISABLE_JIT
    numba.config.DISABLE_JIT = True
    try:
        yield
    finally:
        numba.config.DISABLE_JIT = previous


def _import_interpreted() -> ModuleType:
    if "ranx" not in sys.modules:
        with _jit_off():
            for name in _SUBMODULES:
                importlib.import_module(name)
    if hasattr(importlib.import_module("ranx.fusion.wsum")._weighted_sum, "py_func"):  # a numba dispatcher
        raise RuntimeError("ranx was imported with numba's JIT on before tests.ranx_oracle: import it only here")
    return sys.modules["ranx"]


@contextlib.contextmanager
def interpreted_ranx() -> Iterator[ModuleType]:
    """``with interpreted_ranx() as ranx:`` ranx, its kernels interpreted; skips the test without ranx."""
    if importlib.util.find_spec("ranx") is None:
        pytest.skip("ranx is not installed")
    ranx = _import_interpreted()
    with _jit_off():
        yield ranx
