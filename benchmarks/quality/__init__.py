"""Quality benchmarks: the papers' tables on real and synthetic data, with baselines and paired tests."""
