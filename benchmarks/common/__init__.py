"""What the benchmarks share: machine and versions, plots, paired tests, configs and paths, child processes."""
