"""Configuration of the evaluation job (`EvaluateConfig`): the `evaluate:` section of `configs/encode.yaml`, and the
`evaluate:` section of an experiment, whose keys override what the pipeline derives from the experiment
(`madr.job_settings.evaluate_settings`) and are checked when the experiment loads. Plain data: the job that runs
it is `pipelines.evaluate.job`."""

from __future__ import annotations

from dataclasses import dataclass, field

from madr.search.spec import SearchSpec

EXECUTORS = ("auto", "actors")
DEFAULT_METRICS = ["recall@10", "recall@100", "ndcg@10", "mrr@10", "map@100", "p@1", "hit@10"]


@dataclass
class EvaluateConfig:
    """Queries / qrels files (or a BEIR directory and its `split`), the runs to compare (`SearchSpec`: an index
    manifest, its model and search settings), the metrics at depth `k` (`madr.metrics.evaluate`: binary metrics
    count grades >= `relevance_threshold`, NDCG gains `gains`), and the recall-vs-latency sweep (`sweep` values of
    nprobe / efSearch, `sweep_metric`); `pipelines.evaluate.job` runs it (its module docstring has the outputs)."""

    queries: str = ""
    qrels: str = ""
    beir: str = ""  # a BEIR directory (instead of queries + qrels): its `split` is evaluated
    split: str = "test"
    runs: list[SearchSpec] = field(default_factory=list)
    output: str = "eval_out"
    doc_key: str | None = None  # docs-table column the qrels name documents by (None: the index id)
    qrels_doc_column: str = "doc_id"
    metrics: list[str] = field(default_factory=lambda: list(DEFAULT_METRICS))
    k: int = 100
    relevance_threshold: float = 1.0  # any qrels file (no relevance column reads as 1); paper 000's 0-4 grades: 2
    gains: str = "exp2"
    sweep: list[int] | None = None  # nprobe / efSearch values; None: powers of two up to nlist (IVF), 16..512 (HNSW)
    sweep_metric: str = "recall@10"
    search_actors: int = 1
    batch_size: int = 256
    plot: bool = True
    # where the queries are searched: "auto", in the job's process with every CPU of a one-node cluster as torch
    # threads (the node's actors would share its CPUs anyway; the model and index are loaded there for the sweep
    # already), else on a pool of search_actors Ray actors; "actors": always the pool. Either way the job's own
    # process searches queries that fit one batch (batch_size).
    executor: str = "auto"

    def __post_init__(self) -> None:
        from madr.config import from_dict

        self.runs = [r if isinstance(r, SearchSpec) else from_dict(SearchSpec, r, f"evaluate.runs[{i}].")
                     for i, r in enumerate(self.runs)]
        if self.k < 1:
            raise ValueError(f"evaluate.k must be >= 1, got {self.k}")
        if self.executor not in EXECUTORS:
            raise ValueError(f"evaluate.executor: {self.executor!r} is not one of {', '.join(EXECUTORS)}")
        names = [r.name for r in self.runs]
        if len(set(names)) != len(names):
            raise ValueError(f"evaluate.runs: run names must be unique, got {names}")
        from madr.data.trec import check_tag  # imported here: keeps loading a config light

        for name in names:
            try:
                check_tag(name)
            except ValueError as err:
                raise ValueError(f"evaluate.runs: {err} (the name is the run's TREC file and tag)") from None
        if self.beir and self.queries:
            raise ValueError("evaluate: give queries (+ qrels) or a beir directory, not both")
