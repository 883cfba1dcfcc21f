"""What every benchmark shares: the machine and versions it prints (`machine`), plots (`plotting`), paired
tests and mean ± std (`stats`), config loading with `--set` overrides and the repository paths
(`config`), and the measured child processes of the speed benchmarks (`process`)."""
