"""Evaluation job: queries + qrels -> sharded search -> metrics table and recall-vs-latency plot."""
