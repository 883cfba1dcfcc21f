"""One experiment, in process: data -> tokenizer -> aspect vocabularies -> model -> pretrain -> fine-tune -> eval
-> (aspect models) the confidences' temperatures fitted on the dev split (`madr.recipes.aspects.calibration`).

This is the single-process form of the pipeline; the Ray jobs in `pipelines/` run the same steps
distributed. Everything it writes goes under `cfg.output_dir`.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from madr.config import ExperimentConfig, ModelConfig
from madr.data.beir import read_beir
from madr.data.quarantine import IngestSummary
from madr.data.schema import Catalog
from madr.data.synthetic.catalog import generate_catalog
from madr.layout import RunLayout, prepared_catalog
from madr.modeling.aspect_vocabulary import AspectVocabularies, build_vocabularies
from madr.modeling.backbone import resolve_backbone_path
from madr.modeling.model import BiEncoder, build_model
from madr.modeling.tokenization import corpus_term_ids, load_tokenizer, train_wordpiece_tokenizer
from madr.recipes.aspects.calibration import calibrate, dev_texts
from madr.recipes.aspects.evaluation import evaluate_model
from madr.training.loop import catalog_sampler, stage_runs, train_stage

log = logging.getLogger(__name__)


@dataclass
class ExperimentResult:
    before: dict[str, float]
    after: dict[str, float]
    history: dict[str, list[dict]] = field(default_factory=dict)
    model_dir: str = ""
    seconds: float = 0.0


def catalog_dir(cfg: ExperimentConfig) -> Path:
    """Where `load_catalog` reads or writes: the data stage's validated catalog when it was prepared from this
    config (`madr.layout`), else `data.catalog_dir`, else `<output_dir>/catalog` (generated)."""
    prepared = prepared_catalog(cfg)
    if prepared is not None:
        return prepared
    if cfg.data.catalog_dir and cfg.data.clicks is None:  # a click log's catalog is the run's own, never the user's
        return Path(cfg.data.catalog_dir)
    return Path(cfg.output_dir) / "catalog"


def read_beir_catalog(cfg: ExperimentConfig) -> tuple[Catalog, IngestSummary]:
    """The catalog of `data.beir_dir` (+ `data.qrels`), validated row by row; the rows it quarantined, with
    their counts and summary.json, are written to the run's `data/quarantine` (`madr.layout`)."""
    read = read_beir(cfg.data.beir_dir, qrels=cfg.data.qrels or None, aspect_names=cfg.model.aspects)
    summary = read.write_quarantine(str(RunLayout.of(cfg).quarantine))
    return read.catalog, summary


def load_catalog(cfg: ExperimentConfig) -> Catalog:
    """The catalog of `catalog_dir(cfg)`; read from `data.beir_dir`, or generated (seeded, `data.languages`),
    and written there when the config names no catalog directory and the data stage has not prepared one."""
    where = catalog_dir(cfg)
    if prepared_catalog(cfg) is None and cfg.data.clicks is not None:  # the click log in process (madr.clicks)
        from madr.clicks.catalog import build_click_catalog

        base = Catalog.read(cfg.data.catalog_dir, aspect_names=cfg.model.aspects) if cfg.data.catalog_dir else None
        catalog, _ = build_click_catalog(cfg.data.clicks, RunLayout.of(cfg).clicks, base, cfg.model.aspects)
        catalog.write(where)
        return catalog
    if prepared_catalog(cfg) is not None or cfg.data.catalog_dir:
        return Catalog.read(where, aspect_names=cfg.model.aspects)
    if cfg.data.beir_dir:
        catalog, _ = read_beir_catalog(cfg)
        catalog.write(where)
        return catalog
    catalog = generate_catalog(cfg.data.synthetic_products, cfg.data.synthetic_queries, seed=cfg.data.seed,
                               languages=cfg.data.languages)
    catalog.write(where)
    return catalog


def prepare_tokenizer(cfg: ExperimentConfig, catalog: Catalog) -> PreTrainedTokenizerBase:
    """The backbone's own tokenizer, an explicit one, or a WordPiece trained on the catalog (tiny backbones)."""
    if cfg.data.tokenizer:
        return load_tokenizer(resolve_backbone_path(cfg.data.tokenizer))
    if cfg.model.backbone.name_or_path:
        return load_tokenizer(resolve_backbone_path(cfg.model.backbone.name_or_path))
    trained = Path(cfg.output_dir) / "tokenizer"
    if prepared_catalog(cfg) is not None and (trained / "vocab.txt").is_file():
        return load_tokenizer(str(trained))  # trained by the data stage on this very catalog
    texts = [catalog.product_text(p) for p in catalog.products] + [q.text for q in catalog.queries]
    return train_wordpiece_tokenizer(texts, vocab_size=cfg.data.tokenizer_vocab_size,
                                     out_dir=str(Path(cfg.output_dir) / "tokenizer"))


def prepare_vocabularies(cfg: ExperimentConfig, catalog: Catalog,
                         tokenizer: PreTrainedTokenizerBase) -> AspectVocabularies:
    """Phrase / word / token value vocabularies over product and query annotations (paper 001 Sec. 5.3.1);
    the data stage's (built with Ray Data over the same annotations) when it prepared this catalog."""
    vocab = RunLayout.of(cfg).vocab
    if prepared_catalog(cfg) is not None and vocab.is_file():
        return AspectVocabularies.load(vocab, tokenize=tokenizer.tokenize)  # same vocab_min_freq
    annotations = [p.aspects for p in catalog.products] + [q.aspects for q in catalog.queries]
    return build_vocabularies(annotations, cfg.model.aspects, ["phrase", "word", "token"],
                              tokenize=tokenizer.tokenize, min_freq=cfg.model.vocab_min_freq)


def build_catalog_model(cfg: ModelConfig, catalog: Catalog, tokenizer: PreTrainedTokenizerBase,
                        vocab: AspectVocabularies | None) -> BiEncoder:
    """`build_model`; a `sparse_head` model gets the lean MLM head of this catalog: its decoder
    keeps only the word pieces of the catalog's product texts (`corpus_term_ids`, `BiEncoder.restrict_sparse_terms`;
    e.g. 9,742 of multilingual-e5's 250k for Home Depot), the only pieces a document of the index can weigh, so
    paper 002 Eq. 1-2 score every indexed document as the full head would, at a fraction of the projection's cost.
    A model already restricted (`sparse_vocab_size` set) keeps its terms."""
    model = build_model(cfg, tokenizer, vocab)
    if cfg.sparse_head and cfg.sparse_vocab_size is None:
        model.restrict_sparse_terms(corpus_term_ids(tokenizer, [catalog.product_text(p) for p in catalog.products]))
    return model


def calibrate_on_dev(model: BiEncoder, catalog: Catalog) -> dict:
    """Fit `model.calibration` on the dev split when the model predicts aspect values and the catalog has dev
    queries with annotations; returns the calibration report ({} when there was nothing to fit)."""
    if not model.predicts_aspect_values or not any(catalog.queries_in("dev")):
        return {}
    texts, annotations = dev_texts(catalog, "dev")
    try:
        model.calibration, report = calibrate(model, texts, annotations, "dev split")
    except ValueError as err:  # no dev item has an annotation in the vocabularies
        log.warning("no aspect calibration: %s", err)
        return {}
    return report


def run_experiment(cfg: ExperimentConfig, progress: bool = True) -> ExperimentResult:
    start = time.perf_counter()
    torch.manual_seed(cfg.train.seed)
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg.save(out_dir / "experiment.yaml")
    catalog = load_catalog(cfg)
    tokenizer = prepare_tokenizer(cfg, catalog)
    vocab = prepare_vocabularies(cfg, catalog, tokenizer)
    model = build_catalog_model(cfg.model, catalog, tokenizer, vocab)
    before = evaluate_model(model, catalog, cfg.eval)
    sampler = catalog_sampler(catalog, cfg.train.finetune, tokenizer, cfg.train.seed,
                              index_negatives=RunLayout.of(cfg).negatives)
    history = {}
    for kind, stage in (("pretrain", cfg.train.pretrain), ("finetune", cfg.train.finetune)):
        if stage_runs(kind, stage, cfg.model):
            history[kind] = train_stage(model, sampler, stage, kind, seed=cfg.train.seed, progress=progress)
    after = evaluate_model(model, catalog, cfg.eval)
    calibration = calibrate_on_dev(model, catalog)
    model_dir = model.save(out_dir / "model")
    result = ExperimentResult(before, after, history, str(model_dir), time.perf_counter() - start)
    (out_dir / "metrics.json").write_text(json.dumps({"before": before, "after": after, "calibration": calibration,
                                                      "seconds": result.seconds}, indent=2))
    (out_dir / "history.json").write_text(json.dumps(history))
    return result
