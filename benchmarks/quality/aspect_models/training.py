"""Training and evaluating each row of the multi-aspect product-search tables, with the per-row result cache:
<output_dir>/seed<seed>/<row>/result.json, reused while its fingerprint (`row_fingerprint`) matches."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.quality.aspect_models.data import EvalSet
from benchmarks.quality.aspect_models.evaluation import (
    bm25_runs,
    eval_model,
    means,
    per_query_metrics,
    search_depth,
)
from benchmarks.quality.aspect_models.rows import label_of, model_config, stage_config, training_changes
from madr.config import ExperimentConfig, config_hash
from madr.data.schema import Catalog
from madr.modeling.model import BiEncoder, build_model
from madr.recipes.aspects.experiment import build_catalog_model
from madr.training.freezing import backbone_frozen, freeze_backbone
from madr.training.loop import catalog_sampler, stage_runs, train_stage
from madr.training.memoised_backbone import memoised_backbones


def train_row(key: str, cfg: ExperimentConfig, catalog: Catalog, tokenizer, vocab, seed: int,
              freeze_embeddings: bool, freeze_layers: int = 0,
              on_log: Callable[[BiEncoder, str, int, dict], None] | None = None,
              pretrain_frozen: bool = False, pretrain_frozen_params: Sequence[str] = (),
              device: str | torch.device = "cpu") -> tuple[BiEncoder, dict]:
    """Build row `key` from the shared start weights with torch seeded by `seed` (word embeddings frozen when
    `freeze_embeddings`, and the lowest `freeze_layers` layers, `madr.training.freezing`), then pretrain (when
    `madr.training.loop.stage_runs`; never DSSM, as `run_experiment`) and fine-tune on the train queries.
    `on_log(model, stage, step, losses)` is called every `log_every` steps of each stage (a learning curve).
    `pretrain_frozen`: the whole backbone stays frozen while pretraining and each distinct text runs through it
    once (`madr.training.memoised_backbone`): the heads train on cached token states; the weights named by
    `pretrain_frozen_params` (substrings, e.g. "aen.w_v") stay frozen too. MUR / MURAL put their aspect tokens
    into the backbone's input, so their frozen backbone runs every step (no memo): the aspect tokens and heads
    train through it. `device`: where the model trains (the batches follow the model)."""
    mcfg = model_config(cfg, key)
    torch.manual_seed(seed)
    model = build_catalog_model(mcfg, catalog, tokenizer, vocab).to(device)  # a sparse head: the catalog's pieces
    # word embeddings: 12M of all-MiniLM's 23M weights, a third of the step time on 2 CPU cores
    freeze_backbone(model, freeze_embeddings, freeze_layers)
    stages = {kind: stage_config(cfg, key, kind) for kind in ("pretrain", "finetune")}
    sampler = catalog_sampler(catalog, stages["finetune"], tokenizer, seed)
    if on_log is not None:
        on_log(model, "start", 0, {})
    history = {}
    for kind, stage in stages.items():
        if stage_runs(kind, stage, mcfg):
            hook = None if on_log is None else (lambda step, rec, kind=kind: on_log(model, kind, step, rec))
            with contextlib.ExitStack() as frozen:
                if kind == "pretrain":
                    frozen.enter_context(backbone_frozen(model, pretrain_frozen, pretrain_frozen_params))
                    if pretrain_frozen and not mcfg.uses_granularities:  # heads only, on cached token states
                        frozen.enter_context(memoised_backbones(model))
                history[kind] = train_stage(model, sampler, stage, kind, seed=seed, on_log=hook)
    info = {kind: {"steps": len(h), "final_loss": float(np.mean([r["loss"] for r in h[-20:]]))}
            for kind, h in history.items()}
    info["parameters"] = sum(p.numel() for p in model.parameters())
    info["trained_parameters"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return model, info


def zero_shot_model(cfg: ExperimentConfig, tokenizer, bench: dict) -> BiEncoder:
    """The untrained backbone as BiBERT with `bench.zero_shot_pooling` (seeded: the head is random)."""
    torch.manual_seed(0)
    return build_model(dataclasses.replace(cfg.model, name="bibert", pooling=bench["zero_shot_pooling"]), tokenizer,
                       None)


def reference_rows(keys: list[str], cfg: ExperimentConfig, ev: EvalSet, tokenizer, lengths: dict, bench: dict
                   ) -> tuple[dict, dict]:
    """Per-query metrics and seconds of the untrained rows (seed-independent)."""
    rows, seconds = {}, {}
    k = search_depth(cfg)
    if "bm25" in keys:
        t0 = time.perf_counter()
        rows["bm25"] = per_query_metrics(*bm25_runs(tokenizer, ev, k), ev, cfg)
        seconds["bm25"] = {"eval": time.perf_counter() - t0}
    if "zero_shot" in keys:
        t0 = time.perf_counter()
        rows["zero_shot"], _ = eval_model(zero_shot_model(cfg, tokenizer, bench), ev, lengths, cfg,
                                          bench["encode_batch_size"], "zero-shot")
        seconds["zero_shot"] = {"eval": time.perf_counter() - t0}
    for key in rows:
        print(f"{label_of(key, bench, cfg)}: {json.dumps({m: round(v, 4) for m, v in means(rows[key]).items()})} "
              f"({seconds[key]['eval']:.0f} s)", flush=True)
    return rows, seconds


def row_fingerprint(key: str, seed: int, cfg: ExperimentConfig, ev: EvalSet, bench: dict) -> str:
    """What a row's result depends on: its model, training and evaluation settings, the data (a Home Depot
    catalog's directory name hashes the annotator code and split), the evaluated corpus, the seed and the
    frozen-embedding switch."""
    settings = {k: v for k, v in cfg.to_dict().items() if k not in ("name", "output_dir")}
    corpus = hashlib.sha256("\n".join(ev.product_ids).encode()).hexdigest()
    changes = {"training_changes": training_changes(key)} if training_changes(key) else {}
    return config_hash({"row": key, "model": dataclasses.asdict(model_config(cfg, key)), "settings": settings,
                        "corpus": corpus, "seed": seed, "freeze_word_embeddings": bool(bench["freeze_word_embeddings"]),
                        **changes})


def run_row(key: str, cfg: ExperimentConfig, catalog: Catalog, ev: EvalSet, tokenizer, vocab, lengths: dict,
            seed: int, bench: dict) -> dict[str, Any]:
    """Train and evaluate row `key` with `seed`; the result is kept in <output_dir>/seed<seed>/<key>/result.json
    and reused while its fingerprint matches (a stopped multi-seed run resumes at the next row)."""
    where = Path(cfg.output_dir) / f"seed{seed}" / key
    cache, fingerprint = where / "result.json", row_fingerprint(key, seed, cfg, ev, bench)
    saving = key in bench["save_models"]
    if cache.is_file() and (not saving or (where / "model").is_dir()):
        kept = json.loads(cache.read_text())
        if kept.get("fingerprint") == fingerprint:
            print(f"seed {seed} {label_of(key, bench, cfg)}: kept from {cache}", flush=True)
            return kept
    t0 = time.perf_counter()
    model, training = train_row(key, cfg, catalog, tokenizer, vocab, seed, bool(bench["freeze_word_embeddings"]))
    t1 = time.perf_counter()
    per_q, aspects = eval_model(model, ev, lengths, cfg, bench["encode_batch_size"], label_of(key, bench, cfg))
    result = {"fingerprint": fingerprint, "per_query": per_q, "aspects": aspects, "training": training,
              "seconds": {"train": t1 - t0, "eval": time.perf_counter() - t1}}
    if saving:  # e.g. for benchmarks.quality.explain_case_study
        print(f"saved {key} -> {model.save(where / 'model')}", flush=True)
    where.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(cache)
    shown = {m: round(v, 4) for m, v in {**means(per_q), **aspects}.items()}
    print(f"seed {seed} {label_of(key, bench, cfg)}: {json.dumps(shown)} ({result['seconds']['train']:.0f} s train, "
          f"{result['seconds']['eval']:.0f} s eval)", flush=True)
    return result


def run_seed(keys: list[str], cfg: ExperimentConfig, catalog: Catalog, ev: EvalSet, tokenizer, vocab,
             lengths: dict, seed: int, bench: dict) -> dict[str, Any]:
    rows = {key: run_row(key, cfg, catalog, ev, tokenizer, vocab, lengths, seed, bench) for key in keys}
    return {"seed": seed, **{part: {key: r[part] for key, r in rows.items()}
                             for part in ("per_query", "aspects", "seconds", "training")}}
