"""The product-search benchmark's rows, data and evaluation (`benchmarks.quality.homedepot_hybrid`)."""
