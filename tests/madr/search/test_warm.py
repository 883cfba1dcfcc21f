"""`python -m madr.search.sparse.warm` (run by scripts/bootstrap.sh) compiles every kernel a search can take."""

from __future__ import annotations

from madr.search.sparse import compiled, maxscore
from madr.search.sparse.warm import warm_kernels


def test_every_kernel_variant_is_compiled():
    assert warm_kernels() == ["compiled/1", "compiled/2", "maxscore/1", "maxscore/2"]
    for kernel in (compiled.search_taat_serial, compiled.search_taat_parallel, maxscore.search_maxscore_serial,
                   maxscore.search_maxscore_parallel):
        assert kernel.signatures, f"{kernel.py_func.__name__} was not compiled"
