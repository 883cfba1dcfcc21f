"""Ray Data ingestion: read every source, validate it (bad rows to a quarantine), normalise it to one
schema per task, tokenise it on CPU actors and mix the tasks into one-task batches for training.

Modules: `sources` (one schema per source, one per task), `file_parts` (the files of a read and their parts), `raw_files`
(the Ray Data datasource: raw blocks with exact row origins), `readers` (validated / tokenised reads, ingest),
`tokenize` (actor-pool tokenisation, length bucketing, padding), `mixing` (TaskSchedule-driven task
mixing sharded over workers), `vocab_job` (aspect vocabularies with Ray aggregations), `stats` (aspect
coverage and vocabulary sizes), `cli` (`python -m pipelines.data ...`), `prepare` (the experiment's data
stage: a catalog, a BEIR directory or the synthetic world). Row validation (`madr.data.validation`) and the
quarantine (`madr.data.quarantine`) are Ray-free and shared with the format readers of `madr.data`.
"""
