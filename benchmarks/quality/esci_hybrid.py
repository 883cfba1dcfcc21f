"""The product-search hybrid table (`benchmarks.quality.homedepot_hybrid`, issue 26) on the ESCI samples: does
the best madr configuration lose to BM25 + e5 out of domain?

Data: the public Amazon Shopping Queries (ESCI) samples with product text (`madr.data.sources.esci`: 54 US
queries, 530 products, Exact = relevant, every other product a distractor), as in
`benchmarks.quality.esci_transfer`. Nothing is tuned on them: the 54 queries are a test set only.

Rows, those of the hybrid table (its config, `configs/real/homedepot_hybrid.yaml`, is this script's):
- BM25 on the word pieces of `bench.lexical_tokenizer`, and on the trained rows' own pieces (what an index built
  with `index.lexical: bm25` holds: the saved model's tokenizer, lower-cased as the hybrid script does);
- each `bench.references` encoder untrained (`homedepot_hybrid.reference_model`: mean pooling, cosine, its own
  prefixes), and their fusions with BM25 with the weights the hybrid run chose on the Home Depot dev split,
  read from its result JSON (`--hybrid-result`: `fusions[<row>]`); BM25 + e5 also by reciprocal rank fusion;
- each `bench.trained` row's model saved by the hybrid run (<output_dir>/seed<seed>/<row>/model), alone and in
  each fusion of `homedepot_hybrid.trained_fusions` with that seed's Home Depot dev weights
  (`training[<seed>][<row>]` of the JSON).
Fusion as in the hybrid run (`fusion_lists.fuse`: min-max per query over the union of the top lists, of depth
`search_depth(cfg)`, here the whole sample). Metrics as `esci_transfer` (Recall@10 / @50, MRR@10, NDCG@10 over
the 530 products); trained rows: mean ± std over seeds; paired tests (Student's t and sign-flip randomisation)
of every row against `bench.target` (BM25 + e5) on the seed-mean per query.

    python -m benchmarks.quality.esci_hybrid --threads 1                 # the seeds the hybrid JSON has finished
    python -m benchmarks.quality.esci_hybrid --seeds 0 --set output_dir=/elsewhere/runs/real_homedepot_hybrid \\
        --hybrid-result /elsewhere/benchmarks/results/real_homedepot_hybrid_e5_aspects.json

Writes <out-dir>/results/<tag>.json and <out-dir>/plots/<tag>.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common.config import RESULTS, ROOT, RUN_OUT, add_run_args
from benchmarks.common.machine import load_average, machine_info, run_command
from benchmarks.common.results import write_result_json
from benchmarks.common.stats import seed_mean_std
from benchmarks.quality.aspect_models.data import EvalSet
from benchmarks.quality.aspect_models.evaluation import (
    Lists,
    bm25_lists,
    means,
    search_depth,
    served_pieces,
    top_run,
)
from benchmarks.quality.aspect_models.report import (
    paired_lines,
    relative_table,
    seed_mean,
    significance,
    value_table,
)
from benchmarks.quality.aspect_models.rows import trained_rows
from benchmarks.quality.esci_transfer import METRICS, retrieval_metrics
from benchmarks.quality.fusion_lists import fuse, model_lists, rrf
from benchmarks.quality.homedepot_hybrid import (
    load,
    reference_fusions,
    reference_model,
    trained_fusions,
)
from benchmarks.quality.hybrid_report import plot_rows
from madr.data.sources.esci import esci_text_catalog
from madr.modeling.model import BiEncoder
from madr.modeling.tokenization import load_tokenizer
from madr.recipes.aspects.experiment import resolve_backbone_path

HYBRID_RESULT = RESULTS / "real_homedepot_hybrid_e5_aspects.json"


@dataclasses.dataclass
class Rows:
    """Every retriever's lists on the ESCI sample (key -> Lists; a trained row's keys end in @<seed>)."""

    ev: EvalSet
    k: int
    lists: dict[str, Lists] = dataclasses.field(default_factory=dict)
    labels: dict[str, str] = dataclasses.field(default_factory=dict)  # row (key without @seed) -> label
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)

    def add(self, key: str, label: str, compute: Callable[[], Lists]) -> None:
        t0 = time.perf_counter()
        self.lists[key] = compute()
        self.seconds[key] = time.perf_counter() - t0
        self.labels[key.split("@")[0]] = label
        shown = {m: round(v, 4) for m, v in means(self.metrics(key)).items()}
        print(f"{label} [{key}]: {json.dumps(shown)} ({self.seconds[key]:.0f} s)", flush=True)

    def fused(self, key: str, parts: list[str], weights: list[float], label: str, normalisation: str) -> None:
        shown = " / ".join(f"{w:g}" for w in weights)
        norm = "" if normalisation == "minmax" else f"{normalisation} "  # min-max unless said
        self.add(
            key,
            f"{label}, {norm}weights {shown} (Home Depot dev)",
            lambda: fuse([self.lists[p] for p in parts], weights, self.k, normalisation),
        )

    def metrics(self, key: str) -> dict[str, dict[str, float]]:
        """{metric: {query id: value}} of the top list over the sample (`esci_transfer.retrieval_metrics`)."""
        return retrieval_metrics(top_run(self.lists[key].scores, self.lists[key].ids, self.ev), self.ev)


def read_hybrid_result(path: Path) -> dict:
    if not path.is_file():
        raise SystemExit(
            f"{path}: no hybrid result JSON (run benchmarks.quality.homedepot_hybrid, or pass "
            f"--hybrid-result)"
        )
    return json.loads(path.read_text())


def dev_weights(result: dict, path: Path, where: tuple[str, ...], parts: list[str]) -> tuple[list[float], str]:
    """The Home Depot dev weights and normalisation (min-max when the JSON names none) of the fusion at
    result[where[0]][where[1]]..., which must fuse `parts`; SystemExit naming the file and the key when it is
    missing or was tuned for other parts."""
    node: Any = result
    for depth, key in enumerate(where):
        if not isinstance(node, dict) or key not in node:
            at = "".join(f"[{k!r}]" for k in where[: depth + 1])
            raise SystemExit(
                f"{path}: no Home Depot dev weights at {at} (fusion of {parts}); has the hybrid run "
                f"finished that part?"
            )
        node = node[key]
    at = "".join(f"[{k!r}]" for k in where)
    if not isinstance(node, dict) or "weights" not in node:
        raise SystemExit(f"{path}: {at} has no 'weights'")
    if node.get("parts") != parts or len(node["weights"]) != len(parts):
        raise SystemExit(
            f"{path}: {at} fuses {node.get('parts')} with weights {node['weights']}, expected {parts}"
        )
    return [float(w) for w in node["weights"]], str(node.get("normalisation", "minmax"))


def check_result(result: dict, path: Path, bench: dict) -> None:
    """The JSON's weights were tuned for the same BM25 pieces and reference encoders (names and prefixes)."""
    theirs = result.get("bench", {})
    if theirs.get("lexical_tokenizer") != bench["lexical_tokenizer"]:
        raise SystemExit(
            f"{path}: bench.lexical_tokenizer {theirs.get('lexical_tokenizer')!r}, the config's "
            f"{bench['lexical_tokenizer']!r}: its weights fuse another BM25"
        )
    for name, ref in bench["references"].items():
        other = theirs.get("references", {}).get(name)
        if other is None or (other.get("prefixes") or {}) != (ref.get("prefixes") or {}):
            raise SystemExit(
                f"{path}: bench.references.{name} {other}, the config's {ref}: its weights fuse "
                f"another encoder"
            )


def default_seeds(result: dict, path: Path, trained: list[str]) -> list[int]:
    """The seeds the hybrid run has finished (its `training` entries), none when no row is trained."""
    seeds = sorted(int(s) for s in result.get("training", {}))
    if trained and not seeds:
        raise SystemExit(
            f"{path}: 'training' holds no seed yet (the hybrid run has not finished one); pass --seeds"
        )
    return seeds if trained else []


def saved_models(output_dir: Path, seeds: list[int], trained: list[str]) -> dict[tuple[int, str], Path]:
    """{(seed, row): model directory} of the hybrid run; SystemExit naming every missing one."""
    where = {(s, r): output_dir / f"seed{s}" / r / "model" for s in seeds for r in trained}
    missing = [str(p) for p in where.values() if not (p / "config.json").is_file()]
    if missing:
        raise SystemExit(
            f"no saved model (config.json) in {', '.join(missing)}: run benchmarks.quality."
            f"homedepot_hybrid with these rows in bench.save_models (and --seeds), or pass --seeds"
        )
    return where


def reference_rows(rows: Rows, cfg, bench: dict, result: dict, path: Path, model_pieces: Path | None) -> dict:
    """BM25 (both pieces), the untrained references and their fusions; returns the fusions' weights."""
    lex = load_tokenizer(resolve_backbone_path(bench["lexical_tokenizer"]))
    rows.add("bm25", "BM25 (word pieces)", lambda: bm25_lists(lex.tokenize, rows.ev, rows.k))
    if model_pieces is not None:
        own = load_tokenizer(model_pieces)
        rows.add(
            "bm25_model",
            "BM25 (the trained rows' pieces: the served index's)",
            lambda: bm25_lists(served_pieces(own), rows.ev, rows.k),
        )
    for name, ref in bench["references"].items():
        rows.add(
            name,
            ref.get("label", name),
            lambda ref=ref, name=name: model_lists(
                reference_model(cfg, ref), {"test": rows.ev}, rows.k, bench["encode_batch_size"], name
            )["test"],
        )
    weights = {}
    for key, (parts, label) in reference_fusions(list(bench["references"])).items():
        weights[key], norm = dev_weights(result, path, ("fusions", key), parts)
        rows.fused(key, parts, weights[key], label, norm)
    if "e5" in bench["references"]:
        rows.add(
            "bm25+e5 rrf",
            f"BM25 + e5, reciprocal rank fusion (k = {bench['rrf_k']})",
            lambda: rrf([rows.lists["bm25"], rows.lists["e5"]], rows.k, int(bench["rrf_k"])),
        )
    return weights


def trained_rows_of_seed(
    rows: Rows, cfg, bench: dict, result: dict, path: Path, models: dict, seed: int
) -> dict:
    """Each trained row's saved model of `seed` alone and in its fusions; returns the fusions' weights."""
    weights = {}
    for row in bench["trained"]:
        label = trained_rows(cfg)[row][0]
        key = f"{row}@{seed}"
        rows.add(
            key,
            f"{label} (trained on Home Depot)",
            lambda row=row, key=key: model_lists(
                BiEncoder.load(models[(seed, row)]),
                {"test": rows.ev},
                rows.k,
                bench["encode_batch_size"],
                key,
            )["test"],
        )
        for name, (parts, fused) in trained_fusions(row, seed, label, list(bench["references"])).items():
            weights[name], norm = dev_weights(result, path, ("training", str(seed), name), parts)
            rows.fused(f"{name}@{seed}", parts, weights[name], fused, norm)
    return weights


def report(rows: Rows, seeds: list[int], bench: dict) -> tuple[str, dict]:
    """Values (trained rows: mean ± std over seeds) and relative to `bench.target` with paired tests on the
    seed-mean per query."""
    shared = {k: rows.metrics(k) for k in rows.lists if "@" not in k}
    runs = [
        {
            "seed": s,
            "per_query": {k.split("@")[0]: rows.metrics(k) for k in rows.lists if k.endswith(f"@{s}")},
        }
        for s in seeds
    ]
    per_seed = [{k: means(v) for k, v in {**shared, **r["per_query"]}.items()} for r in runs]
    mean, std = seed_mean_std(per_seed or [{k: means(v) for k, v in shared.items()}])
    pooled = seed_mean(runs, shared) if runs else shared
    target, alpha = bench["target"], float(bench["alpha"])
    tests = significance(pooled, target, int(bench["draws"])) if target in pooled else {}
    seeded = set(mean) - set(shared)
    order = sorted(mean, key=lambda k: (k in seeded, -mean[k]["recall@10"]))  # references first
    text = [
        "## Values (trained rows: mean ± std over seeds)",
        value_table(order, rows.labels, mean, std, METRICS, seeded),
    ]
    if tests:
        text += [
            f"\n## Relative to {rows.labels[target]} († paired t-test p < {alpha:g}, seed-mean per query)",
            relative_table(order, rows.labels, mean, METRICS, target, tests, alpha),
            f"\n## Paired tests vs {rows.labels[target]} (seed-mean per query): diff, p_t, p_rand",
            *paired_lines(tests, rows.labels),
        ]
    return "\n".join(text), {
        "order": order,
        "mean": mean,
        "std": std,
        "per_seed": dict(zip(seeds, per_seed, strict=True)),
        "tests": tests,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_args(p, ROOT / "configs" / "real" / "homedepot_hybrid.yaml", "esci_hybrid")
    p.add_argument(
        "--hybrid-result",
        default=str(HYBRID_RESULT),
        help="the homedepot_hybrid result JSON holding the Home Depot dev fusion weights",
    )
    p.add_argument("--esci-dir", default=str(ROOT.parent / "shared" / "data" / "esci"))
    p.add_argument("--out-dir", default=str(RUN_OUT), help="results/ and plots/ go under it")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    start, load_before = time.perf_counter(), load_average()
    _, cfg, bench = load(Path(args.config), args.set)
    path = Path(args.hybrid_result)
    result = read_hybrid_result(path)
    check_result(result, path, bench)
    seeds = list(args.seeds) if args.seeds is not None else default_seeds(result, path, bench["trained"])
    models = saved_models(Path(cfg.output_dir), seeds, bench["trained"])

    esci = esci_text_catalog(args.esci_dir)
    rows = Rows(EvalSet.of(esci, "test", 3.0), search_depth(cfg))
    data = {
        "products": len(esci.products),
        "queries": len(rows.ev.query_ids),
        "judged_per_query": float(np.mean([len(j) for j in rows.ev.judged])),
    }
    print("data: " + json.dumps(data), flush=True)
    pieces = models[(seeds[0], bench["trained"][0])] / "tokenizer" if models else None
    weights = {
        "fusions": reference_rows(rows, cfg, bench, result, path, pieces),
        "training": {s: trained_rows_of_seed(rows, cfg, bench, result, path, models, s) for s in seeds},
    }
    table, agg = report(rows, seeds, bench)
    info = machine_info(load_average=load_average())
    head = (
        f"# ESCI samples (US, {data['queries']} queries, {data['products']} products, Exact judgments only): "
        f"the Home Depot hybrid table's rows, fusion weights from the Home Depot dev split ({path.name}), "
        f"trained rows from {cfg.output_dir}; seeds {seeds}; nothing tuned on ESCI"
    )
    text = "\n".join(
        [
            head,
            table,
            "\nmachine: " + "; ".join(f"{k} {v}" for k, v in info.items()) + f"; load before {load_before}",
        ]
    )
    print(text, flush=True)
    out = {
        "benchmark": __spec__.name,
        "command": run_command(__spec__.name),
        "hybrid_result": str(path),
        "models": {f"{s}/{r}": str(m) for (s, r), m in models.items()},
        "bench": bench,
        "config": cfg.to_dict(),
        "seeds": seeds,
        "data": data,
        "metrics": METRICS,
        "labels": rows.labels,
        "weights": weights,
        **agg,
        "seconds": rows.seconds,
        "machine": info,
        "load_average_before": load_before,
        "wall_s": time.perf_counter() - start,
        "table": text,
    }
    json_path = write_result_json(Path(args.out_dir), args.tag, out)
    plot_rows(
        agg["order"],
        rows.labels,
        agg["mean"],
        agg["std"],
        METRICS,
        Path(args.out_dir) / "plots" / f"{args.tag}.png",
        bench["target"],
    )
    print(f"wrote {json_path} ({out['wall_s']:.0f} s)")
    return out


if __name__ == "__main__":
    main()
