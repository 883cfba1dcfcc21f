"""Ray layers over `madr`: data ingestion, training, batch encoding, evaluation and the CLI."""
