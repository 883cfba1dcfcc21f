"""Speed, memory and quality runs, each with a peer baseline in the same run (see benchmarks/README.md).

Run a benchmark as a module from the repository root: `python -m benchmarks.quality.homedepot_hybrid --help`.
"""
