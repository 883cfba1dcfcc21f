"""A per-batch function over a Ray Dataset, or over an in-memory table in this process.

A Ray Data execution starts read and map tasks on Ray's workers: seconds that a table the driver already holds,
and that fits in a batch or two, does not need. The data stage hands such tables (a demo or test catalog) to
the same batch functions here; a larger catalog streams through Ray Data (`IN_PROCESS_ROWS`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa

# rows up to which the data stage computes its statistics and vocabularies in the driver
IN_PROCESS_ROWS = 4096


def map_batches(data: Any, fn: Callable[..., pa.Table], fn_kwargs: Mapping[str, Any],
                batch_size: int | None = None) -> Iterator[pa.Table]:
    """`fn(batch, **fn_kwargs)` over the batches of `data`: a Ray Dataset (`map_batches`, pyarrow batches) or a
    `pyarrow.Table` (in this process, in slices of `batch_size` rows; the whole table when None)."""
    if isinstance(data, pa.Table):
        step = batch_size or max(data.num_rows, 1)
        for start in range(0, max(data.num_rows, 1), step):
            yield fn(data.slice(start, step), **fn_kwargs)
        return
    kwargs = {} if batch_size is None else {"batch_size": batch_size}
    ds = data.map_batches(fn, batch_format="pyarrow", fn_kwargs=dict(fn_kwargs), **kwargs)
    yield from ds.iter_batches(batch_format="pyarrow", batch_size=None)
