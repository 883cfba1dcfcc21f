"""Speed and memory benchmarks: ours against a peer on the same machine, data and threads, in one run."""
