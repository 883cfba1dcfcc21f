"""Seeded synthetic data for tests and the demo: a catalog, multilingual multi-task sources, product QA."""
