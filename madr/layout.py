"""Where each stage of an experiment reads and writes, under the experiment's `output_dir`.

One place for the paths the pipeline stages hand to each other (data -> train -> encode -> evaluate ->
serve), so that a stage never guesses where the previous one wrote:

    <output_dir>/data/catalog/        validated catalog (products / queries / judgments Parquet) + prepared.json
    <output_dir>/data/corpus/         one row per product: doc_id (int64, the index id), product_id, text fields
    <output_dir>/data/eval/           queries.parquet + qrels.parquet of the evaluation split
    <output_dir>/data/train/          the same for the training split (hard-negative mining)
    <output_dir>/data/dev/            the same for the dev split (the tune stage's queries)
    <output_dir>/data/vocab.json      phrase / word / token aspect vocabularies (Ray Data aggregation)
    <output_dir>/data/stats.json      aspect coverage (paper 000 Table 3 / paper 001 Table 2)
    <output_dir>/data/quarantine/     BEIR / TREC lines that failed validation (reason, file, line, field) + counts
    <output_dir>/data/clicks/         a click log's impressions, quarantine, summary.json, examination.json / .png
                                      (the estimated position bias) and report.json (`data.clicks`, madr.clicks)
    <output_dir>/<stage>/model/       the export of a training stage (pretrain / finetune / distill / aspects: the
                                      fine-tuned encoder with aspect heads, `pipelines.aspect_heads`)
    <output_dir>/index/manifest.json  the sharded index (its fusion chosen by the tune stage)
    <output_dir>/tune/                fusion.json / fusion.png: the dev grid of the dense + BM25 fusion
    <output_dir>/baseline/            the untrained backbone's model/, index/ (same corpus and BM25 part) and
                                      tune/: the reference `eval.references: [untrained]` evaluates
    <output_dir>/evaluation/          results.md / results.csv / recall-vs-latency plot
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import overload

from madr.config import ExperimentConfig, config_hash
from madr.storage import local_dir

PREPARED_MARKER = "prepared.json"


class _Under:
    """A fixed path below a `RunLayout`'s root, read like an attribute: `layout.vocab` is
    `layout.root / "data" / "vocab.json"` for `vocab = _Under("data", "vocab.json")`."""

    def __init__(self, *parts: str) -> None:
        self.parts = parts

    @overload
    def __get__(self, layout: None, owner: type) -> _Under: ...
    @overload
    def __get__(self, layout: RunLayout, owner: type) -> Path: ...
    def __get__(self, layout: RunLayout | None, owner: type) -> Path | _Under:
        return self if layout is None else layout.root.joinpath(*self.parts)


@dataclass(frozen=True)
class RunLayout:
    """The paths of one experiment below `root` (its `output_dir`), as in the tree above."""

    root: Path

    data = _Under("data")
    catalog = _Under("data", "catalog")
    corpus = _Under("data", "corpus")
    vocab = _Under("data", "vocab.json")
    stats = _Under("data", "stats.json")
    quarantine = _Under("data", "quarantine")
    clicks = _Under("data", "clicks")
    index = _Under("index")
    manifest = _Under("index", "manifest.json")
    evaluation = _Under("evaluation")
    negatives = _Under("mine", "negatives.parquet")
    baseline = _Under("baseline")
    baseline_model = _Under("baseline", "model")
    baseline_index = _Under("baseline", "index")
    baseline_manifest = _Under("baseline", "index", "manifest.json")
    stage_configs = _Under("_stages", "configs")  # the derived config of each stage (pipelines/jobs/experiment.py)

    @classmethod
    def of(cls, cfg: ExperimentConfig) -> RunLayout:
        """The layout of `cfg.output_dir`; an object-store URI's is its local mirror (`madr.storage.local_dir`),
        which the stage runner syncs with the URI before and after each stage."""
        return cls(local_dir(cfg.output_dir))

    def queries(self, split: str) -> Path:
        """Queries of the evaluation (`eval`), training (`train`) or dev (`dev`) split."""
        return self.data / split / "queries.parquet"

    def qrels(self, split: str) -> Path:
        return self.data / split / "qrels.parquet"

    def model(self, stage: str) -> Path:
        return self.root / stage / "model"


def data_key(cfg: ExperimentConfig) -> str:
    """The hash of what decides the prepared catalog: the data section and the aspect names."""
    return config_hash({"data": cfg.data, "aspects": cfg.model.aspects})


def mark_prepared(cfg: ExperimentConfig, counts: dict[str, int]) -> Path:
    """Record that `RunLayout.catalog` holds the catalog of this config (written last by the data stage)."""
    path = RunLayout.of(cfg).catalog / PREPARED_MARKER
    path.write_text(json.dumps({"data_key": data_key(cfg), "counts": counts}, indent=1))
    return path


def prepared_catalog(cfg: ExperimentConfig) -> Path | None:
    """The data stage's catalog when it was prepared from this very data config, else None."""
    path = RunLayout.of(cfg).catalog / PREPARED_MARKER
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return path.parent if info.get("data_key") == data_key(cfg) else None
