"""The product-search benchmark's shared parts (rows, data, evaluation, training): used by
`benchmarks.quality.homedepot_hybrid` and `benchmarks.quality.fusion_lists`."""
