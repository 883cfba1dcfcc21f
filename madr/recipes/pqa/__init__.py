"""Product-QA evidence ranking with the hybrid model (paper 002)."""
