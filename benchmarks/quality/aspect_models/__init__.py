"""The multi-aspect product-search benchmarks' shared parts (rows, data, evaluation, training with the per-row
cache, report): used by `benchmarks.quality.homedepot` (the table) and `benchmarks.quality.esci_transfer`."""
