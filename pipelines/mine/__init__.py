"""Hard-negative mining job: training queries -> sharded search -> negatives Parquet for fine-tuning."""
