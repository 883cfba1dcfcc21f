"""The product-search recipe from catalog to evaluated index: madr's pipeline (`python -m pipelines.jobs
pipeline`, stages data, finetune, encode, tune, evaluate) against a hand-written single-process peer (pandas,
sentence-transformers with mined negatives, FAISS, bm25s) with the same settings: wall time per stage, the ratio
madr / peer, both sides' test metrics.

    python -m benchmarks.speed.pipeline_vs_peer --catalog /path/to/homedepot_catalog        # the full run
    python -m benchmarks.speed.pipeline_vs_peer --steps 2 --out-dir runs/pipeline_vs_peer_smoke   # sample catalog
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import random
import resource
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.config import ROOT, parser, write_result_json
from benchmarks.common.machine import load_average, machine_line, run_command, versions
from benchmarks.common.peer import bm25_index, bm25_search, dense_index, fuse, word_pieces
from benchmarks.common.process import ProcessTree, call_in_child, child_env, module_command

MODULE = "benchmarks.speed.pipeline_vs_peer"
CONFIG = "configs/product_search.yaml"
STAGES = ("data", "finetune", "encode", "tune", "evaluate")
MIN_RELEVANCE = 3  # a positive for fine-tuning and mining (madr.training.negatives, pipelines.train.examples)
ENCODE_BATCH = 64


def recipe(config: str, sets: list[str], steps: int | None) -> dict[str, Any]:
    """The settings both sides run with: the pipeline config's, with `sets` (``--set key=value``) and `steps`."""
    from madr.config import load_config
    from madr.config_overrides import parse_overrides
    from madr.index.lexical import LexicalInfo
    from madr.modeling.backbone import resolve_backbone_path

    overrides = parse_overrides(sets)
    if steps is not None:
        overrides["train.finetune.steps"] = steps
    cfg = load_config(config if Path(config).is_file() else ROOT / config, overrides)
    ft, m = cfg.train.finetune, cfg.model
    return {"backbone": resolve_backbone_path(m.backbone.name_or_path),
            "lexical_tokenizer": resolve_backbone_path(cfg.index.lexical_tokenizer or m.backbone.name_or_path),
            "query_prefix": m.text_prefixes.get("query", ""), "doc_prefix": m.text_prefixes.get("doc", ""),
            "max_query_length": m.max_query_length, "max_doc_length": m.max_doc_length,
            "temperature": m.temperature, "steps": ft.steps, "batch_size": ft.batch_size,
            "learning_rate": ft.learning_rate, "warmup_ratio": ft.warmup_ratio, "weight_decay": ft.weight_decay,
            "seed": cfg.train.seed, "mined_depth": ft.mined_depth, "freeze_word_embeddings": ft.freeze_word_embeddings,
            "freeze_layers": ft.freeze_layers, "k1": LexicalInfo.k1, "b": LexicalInfo.b,
            "lambda_step": cfg.tune.lambda_step, "normalisations": list(cfg.tune.normalisations),
            "tune_metric": cfg.tune.metric, "top_k": cfg.eval.top_k,
            "candidates": cfg.tune.candidates or max(cfg.eval.top_k, 100),
            "metrics": list(cfg.eval.retrieval_metrics), "relevance_threshold": cfg.eval.relevance_threshold,
            "gains": cfg.eval.gains}


def settings_key(catalog: Path, config: str, sets: list[str], steps: int | None) -> str:
    """A short hash of what a result depends on: the catalog's files (names, sizes, mtimes), config, sets, steps."""
    files = sorted((p.name, p.stat().st_size, int(p.stat().st_mtime)) for p in catalog.glob("*.parquet"))
    text = json.dumps([str(catalog.resolve()), files, config, sets, steps])
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def sample_catalog(config: str, out: Path) -> Path:
    """The catalog the pipeline generates when `data.catalog_dir` is null, written once to `out`."""
    from madr.config import load_config
    from madr.data.synthetic.catalog import generate_catalog

    if not (out / "judgments.parquet").is_file():
        d = load_config(config if Path(config).is_file() else ROOT / config).data
        generate_catalog(d.synthetic_products, d.synthetic_queries, seed=d.seed, languages=d.languages).write(out)
    return out


def read_catalog(catalog: Path) -> dict[str, Any]:
    """data: product ids and texts, queries per split (ids, texts), judgments as {query: {product: grade}}."""
    import pandas as pd

    products = pd.read_parquet(catalog / "products.parquet", columns=["product_id", "title", "description"])
    queries = pd.read_parquet(catalog / "queries.parquet", columns=["query_id", "text", "split"])
    judgments = pd.read_parquet(catalog / "judgments.parquet", columns=["query_id", "product_id", "relevance"])
    qrels: dict[str, dict[str, float]] = {}
    for q, p, r in judgments.itertuples(index=False):
        qrels.setdefault(str(q), {})[str(p)] = float(r)
    splits = {s: (g.query_id.astype(str).tolist(), g.text.tolist()) for s, g in queries.groupby("split")}
    return {"ids": products.product_id.astype(str).tolist(),
            "texts": (products.title + " " + products.description).str.strip().tolist(),
            "splits": splits, "qrels": qrels}


def mine_triplets(data: dict[str, Any], s: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(query, positive, BM25-mined negative) texts, one per judged positive of a train query, shuffled."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(s["backbone"])
    texts, row_of = data["texts"], {p: i for i, p in enumerate(data["ids"])}
    qids, qtexts = data["splits"]["train"]
    relevant = {q: {p for p, r in data["qrels"].get(q, {}).items() if r >= MIN_RELEVANCE} for q in qids}
    train = [(q, t) for q, t in zip(qids, qtexts, strict=True) if relevant[q]]
    index = bm25_index(word_pieces(tokenizer, texts), len(tokenizer), s["k1"], s["b"])
    depth = s["mined_depth"] + 4 * max((len(r) for r in relevant.values()), default=0)
    ranked = bm25_search(index, word_pieces(tokenizer, [t for _, t in train]), depth, len(texts))
    rng, triplets = random.Random(s["seed"]), []
    for (q, text), (rows, _) in zip(train, ranked, strict=True):
        twins = {texts[row_of[p]] for p in relevant[q] if p in row_of}
        mined = [r for r in rows.tolist() if data["ids"][r] not in relevant[q] and texts[r] not in twins]
        mined = mined[:s["mined_depth"]] or [rng.randrange(len(texts))]
        triplets += [(text, texts[row_of[p]], texts[rng.choice(mined)]) for p in sorted(relevant[q]) if p in row_of]
    rng.shuffle(triplets)
    return triplets


def load_model(s: dict[str, Any]) -> Any:
    """The backbone as a sentence-transformers model with mean pooling, on the CPU."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    word = Transformer(s["backbone"], max_seq_length=s["max_doc_length"])
    return SentenceTransformer(modules=[word, Pooling(word.get_embedding_dimension(), "mean")], device="cpu")


def freeze(model: Any, s: dict[str, Any]) -> None:
    """No gradient for the word embeddings and, with `freeze_layers`, every embedding and the lowest layers."""
    bert = model[0].auto_model
    frozen = [bert.get_input_embeddings().weight] if s["freeze_word_embeddings"] else []
    if s["freeze_layers"]:
        frozen += list(bert.embeddings.parameters())
        frozen += [p for layer in bert.encoder.layer[:s["freeze_layers"]] for p in layer.parameters()]
    for p in frozen:
        p.requires_grad_(False)


def features(model: Any, texts: list[str], prefix: str, length: int) -> dict[str, Any]:
    """The prefixed texts tokenised at `length` tokens."""
    model.max_seq_length = length
    return model.preprocess([prefix + t for t in texts])


def train(model: Any, triplets: list[tuple[str, str, str]], s: dict[str, Any]) -> list[float]:
    """`steps` AdamW steps of MultipleNegativesRankingLoss over batches of triplets (cycled); the losses."""
    import torch
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from transformers import get_linear_schedule_with_warmup

    torch.manual_seed(s["seed"])
    loss_fn = MultipleNegativesRankingLoss(model, scale=1.0 / s["temperature"])
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=s["learning_rate"], weight_decay=s["weight_decay"])
    schedule = get_linear_schedule_with_warmup(opt, int(s["warmup_ratio"] * s["steps"]), max(s["steps"], 1))
    model.train()
    losses, bs = [], s["batch_size"]
    for step in range(s["steps"]):
        batch = [triplets[(step * bs + i) % len(triplets)] for i in range(min(bs, len(triplets)))]
        q, p, n = (list(x) for x in zip(*batch, strict=True))
        loss = loss_fn([features(model, q, s["query_prefix"], s["max_query_length"]),
                        features(model, p, s["doc_prefix"], s["max_doc_length"]),
                        features(model, n, s["doc_prefix"], s["max_doc_length"])], None)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        schedule.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def encode(model: Any, texts: list[str], prefix: str, length: int) -> np.ndarray:
    """Normalised float32 embeddings of the prefixed texts truncated at `length` tokens."""
    model.max_seq_length = length
    return model.encode([prefix + t for t in texts], batch_size=ENCODE_BATCH, normalize_embeddings=True,
                        convert_to_numpy=True, show_progress_bar=False).astype(np.float32)


def build_index(model: Any, data: dict[str, Any], s: dict[str, Any], out: Path) -> dict[str, Any]:
    """encode: every product into a FAISS Flat index (inner product), bm25s over the lexical tokenizer's pieces; both saved."""
    import faiss
    from transformers import AutoTokenizer

    flat = dense_index(encode(model, data["texts"], s["doc_prefix"], s["max_doc_length"]))
    lexical = AutoTokenizer.from_pretrained(s["lexical_tokenizer"])
    bm25 = bm25_index(word_pieces(lexical, data["texts"]), len(lexical), s["k1"], s["b"])
    out.mkdir(parents=True, exist_ok=True)
    faiss.write_index(flat, str(out / "dense.faiss"))
    bm25.save(str(out / "bm25s"))
    return {"flat": flat, "bm25": bm25, "lexical": lexical, "n": len(data["texts"])}


def fused_metrics(model: Any, index: dict[str, Any], data: dict[str, Any], s: dict[str, Any],
                  split: str) -> Callable[[float, str], dict[str, float]]:
    """Per query of `split` the dense and the BM25 top `candidates` (searched once); the metrics of their fusion
    at (lam, normalisation)."""
    qids, texts = data["splits"][split]
    k = min(s["candidates"], index["n"])
    scores, rows = index["flat"].search(encode(model, texts, s["query_prefix"], s["max_query_length"]), k)
    dense = [(r[r >= 0].astype(np.int64), sc[r >= 0]) for r, sc in zip(rows, scores, strict=True)]
    bm25 = bm25_search(index["bm25"], word_pieces(index["lexical"], texts), k, index["n"])

    def metrics(lam: float, how: str) -> dict[str, float]:
        ranked = [fuse(d, b, lam, how, s["top_k"]) for d, b in zip(dense, bm25, strict=True)]
        return score(to_run(qids, ranked, data["ids"]), qids, data, s)

    return metrics


def to_run(qids: list[str], ranked: list[tuple[np.ndarray, np.ndarray]], ids: list[str]) -> dict:
    """{query id: {product id: score}} of ranked (rows, scores) lists."""
    return {q: {ids[r]: float(sc) for r, sc in zip(rows.tolist(), scores.tolist(), strict=True)}
            for q, (rows, scores) in zip(qids, ranked, strict=True)}


def score(run: dict, qids: list[str], data: dict[str, Any], s: dict[str, Any]) -> dict[str, float]:
    """``madr.metrics.evaluate`` of `run` over the judgments of `qids` (those that have any)."""
    from madr.metrics import evaluate

    qrels = {q: data["qrels"][q] for q in qids if q in data["qrels"]}
    names = list(dict.fromkeys([s["tune_metric"], *s["metrics"]]))
    values = evaluate(run, qrels, names, relevance_threshold=s["relevance_threshold"], gains=s["gains"])
    return {n: float(v) for n, v in values.items()}


def tune(model: Any, index: dict[str, Any], data: dict[str, Any], s: dict[str, Any]) -> dict[str, Any]:
    """The (lam, normalisation) of the grid best on dev by `tune_metric` (first in grid order on ties)."""
    metrics = fused_metrics(model, index, data, s, "dev")
    n = int(round(1.0 / s["lambda_step"]))
    best: dict[str, Any] = {"value": -1.0}
    for how in s["normalisations"]:
        for lam in (round(i * s["lambda_step"], 10) for i in range(n + 1)):
            value = metrics(lam, how)[s["tune_metric"]]
            if value > best["value"]:
                best = {"lam": lam, "normalisation": how, "value": value}
    return best


def evaluate_test(model: Any, index: dict[str, Any], data: dict[str, Any], s: dict[str, Any],
                  choice: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Test metrics of the chosen fusion and of its halves (lam 1: dense, lam 0: BM25)."""
    metrics = fused_metrics(model, index, data, s, "test")
    return {name: metrics(lam, choice["normalisation"])
            for name, lam in {"fused": choice["lam"], "dense": 1.0, "bm25": 0.0}.items()}


def timed(stages: dict[str, dict], name: str, fn: Callable[[], Any]) -> Any:
    """Run `fn`, recording its wall seconds and the process's peak RSS (GiB) when it ends under `name`."""
    t0 = time.perf_counter()
    out = fn()
    stages[name] = {"seconds": time.perf_counter() - t0,
                    "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    print(f"[peer] {name}: {stages[name]['seconds']:.1f} s", flush=True)
    return out


def run_peer(catalog: str, s: dict[str, Any], work: str) -> dict[str, Any]:
    """The peer's five stages, timed (module docstring), in a fresh interpreter (`call_in_child`: its imports counted
    in its stages); its stage times, fusion choice and test metrics."""
    stages: dict[str, dict] = {}
    data = timed(stages, "data", lambda: read_catalog(Path(catalog)))

    def finetune() -> tuple[Any, list[float]]:
        triplets = mine_triplets(data, s)
        model = load_model(s)
        freeze(model, s)
        losses = train(model, triplets, s)
        model.save(str(Path(work) / "model"))
        return model, losses

    model, losses = timed(stages, "finetune", finetune)
    index = timed(stages, "encode", lambda: build_index(model, data, s, Path(work) / "index"))
    choice = timed(stages, "tune", lambda: tune(model, index, data, s))
    metrics = timed(stages, "evaluate", lambda: evaluate_test(model, index, data, s, choice))
    return {"stages": stages, "total_s": sum(v["seconds"] for v in stages.values()), "fusion": choice,
            "metrics": metrics, "losses": losses, "products": len(data["texts"]),
            "queries": {k: len(v[0]) for k, v in data["splits"].items()}}


def measure_peer(catalog: Path, s: dict[str, Any], work: Path) -> dict[str, Any]:
    """`run_peer` in a fresh interpreter; its result plus the process's wall time."""
    load, t0 = load_average(), time.perf_counter()
    out = call_in_child(MODULE, "run_peer", {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"},
                        catalog=str(catalog), s=s, work=str(work))
    return {**out, "process_s": time.perf_counter() - t0, "load_before": load}


def madr_command(catalog: Path, run: Path, config: str, sets: list[str], steps: int | None) -> list[str]:
    """The pipeline command over `catalog` into `run` (module docstring)."""
    extra = [*sets, *([f"train.finetune.steps={steps}"] if steps is not None else [])]
    base = [f"data.catalog_dir={catalog.resolve()}", f"output_dir={run.resolve()}", "eval.references=[bm25, dense]"]
    return [*module_command("pipelines.jobs"), "pipeline", "--config", config,
            *[a for kv in (*base, *extra) for a in ("--set", kv)], "--stages", ",".join(STAGES)]


def read_madr_run(run: Path) -> dict[str, Any]:
    """Stage durations (markers), test metrics (results.csv: fused / dense / bm25) and the tune stage's choice."""
    stages = {name: {"seconds": float(json.loads((run / "_stages" / f"{name}.done.json").read_text())["duration_s"])}
              for name in STAGES}
    with open(run / "evaluation" / "results.csv", newline="") as f:
        rows = {r["run"]: r for r in csv.DictReader(f)}
    model = next(n for n in rows if n.endswith("-dense"))[: -len("-dense")]
    names = {"fused": model, "dense": f"{model}-dense", "bm25": "bm25"}
    metrics = {side: {k: float(v) for k, v in rows[name].items() if k.startswith(("recall@", "mrr@", "ndcg@"))}
               for side, name in names.items()}
    fusion = json.loads((run / "tune" / "fusion.json").read_text())
    return {"stages": stages, "total_s": sum(v["seconds"] for v in stages.values()), "metrics": metrics,
            "fusion": {"lam": fusion["lam"], "normalisation": fusion["normalisation"], "value": fusion["value"]}}


def node_sets(nodes: int, cpus: int, threads: int) -> list[str]:
    """The pipeline's settings for `nodes` worker nodes of `cpus` logical CPUs and `threads` cores each: one training
    worker per node (half the node's logical CPUs; the other half left to Ray Data's readers, which a worker holding
    the whole node would starve) and one encode actor per node, spread, each with `threads` torch threads."""
    return [f"distributed.num_workers={nodes}", "distributed.placement_strategy=STRICT_SPREAD",
            f"distributed.cpus_per_worker={cpus / 2:g}", f"distributed.torch_threads={threads}",
            f"encode.encode_actors={nodes}", "encode.spread_actors=true", f"encode.encode_cpus={cpus / 2:g}",
            f"encode.torch_threads={threads}"]


def measure_madr(catalog: Path, run: Path, config: str, sets: list[str], steps: int | None,
                 nodes: int = 0) -> dict[str, Any]:
    """The pipeline as a subprocess under a process-tree sampler; `read_madr_run` plus wall time and peak PSS. With
    `nodes`, each stage is a Ray job on a local cluster of a CPU-less head and `nodes` worker nodes sharing this
    machine's cores (`pipelines.jobs.local_cluster`; each node declares every core as a logical CPU and its torch
    threads take its share of them), as on a cluster of that many machines."""
    import os

    from pipelines.jobs import local_cluster
    from pipelines.runtime import apply_ray_env

    apply_ray_env(offline=True)  # Ray network hygiene (scripts/ray_env.sh) for the pipeline's processes
    cpus = max(2, os.cpu_count() or 1)
    spread = node_sets(nodes, cpus, max(1, (os.cpu_count() or 1) // max(nodes, 1))) if nodes else []
    cmd = madr_command(catalog, run, config, [*sets, *spread], steps)
    head = local_cluster.start(num_cpus=0) if nodes else None
    load, t0, workers = load_average(), time.perf_counter(), []
    try:
        for _ in range(nodes):
            workers.append(local_cluster.add_node(head, num_cpus=cpus))
        if head is not None:
            cmd += ["--address", head.address, "--token-file", str(head.token_file)]
        print("[madr] " + " ".join(cmd), flush=True)
        with ProcessTree() as tree:
            subprocess.run(cmd, env=child_env(), cwd=ROOT, check=True)
    finally:
        for node in reversed(workers):
            local_cluster.stop(node)
        if head is not None:
            local_cluster.stop(head)
    return {**read_madr_run(run), "process_s": time.perf_counter() - t0, "peak_pss_gib": tree.peak / 2**30,
            "command": cmd, "load_before": load, "nodes": nodes}


def compare(madr: dict[str, Any], peer: dict[str, Any]) -> dict[str, Any]:
    """Per-stage and total ratios madr / peer, and madr's extra seconds per stage."""
    stages = {n: {"madr_s": madr["stages"][n]["seconds"], "peer_s": peer["stages"][n]["seconds"]} for n in STAGES}
    for v in stages.values():
        v["ratio"] = v["madr_s"] / v["peer_s"] if v["peer_s"] > 0 else float("nan")
        v["extra_s"] = v["madr_s"] - v["peer_s"]
    return {"stages": stages, "total": {"madr_s": madr["total_s"], "peer_s": peer["total_s"],
                                        "ratio": madr["total_s"] / peer["total_s"]},
            "process": {"madr_s": madr["process_s"], "peer_s": peer["process_s"]}}


def print_report(result: dict[str, Any]) -> None:
    """The per-stage table, totals and both sides' fusion choices and test metrics."""
    cmp, madr, peer = result["comparison"], result["madr"], result["peer"]
    print(f"\n{result['machine']}\n{result['versions']}\nload (1 / 5 / 15 min) before madr "
          f"{madr.get('load_before', '?')}, before the peer {peer.get('load_before', '?')}, at the end {result['load']}")
    print(f"{'stage':10s} {'madr s':>9s} {'peer s':>9s} {'ratio':>7s} {'extra s':>9s}")
    for name, v in cmp["stages"].items():
        print(f"{name:10s} {v['madr_s']:9.1f} {v['peer_s']:9.1f} {v['ratio']:7.2f} {v['extra_s']:9.1f}")
    t = cmp["total"]
    print(f"{'total':10s} {t['madr_s']:9.1f} {t['peer_s']:9.1f} {t['ratio']:7.2f}  (target <= 1.3)")
    for side in ("madr", "peer"):
        f = result[side]["fusion"]
        print(f"{side} fusion: lam {f['lam']:g}, {f['normalisation']}, dev {f['value']:.4f}")
    for run in ("fused", "dense", "bm25"):
        for m, v in peer["metrics"][run].items():
            if m in madr["metrics"][run]:
                print(f"test {run:6s} {m:12s} madr {madr['metrics'][run][m]:.4f}  peer {v:.4f}")


def side_result(out_dir: Path, tag: str, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The side's result JSON at `<out_dir>/results/<tag>.json` when there, else `measure()` written there."""
    path = out_dir / "results" / f"{tag}.json"
    if path.is_file():
        print(f"{tag}: reusing {path}", flush=True)
        return json.loads(path.read_text())
    result = measure()
    write_result_json(out_dir, tag, result)
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(MODULE, __doc__)
    p.add_argument("--catalog", default=None, help="catalog directory (madr.data.schema); none: the sample catalog")
    p.add_argument("--config", default=CONFIG)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="passed to both sides")
    p.add_argument("--steps", type=int, default=None, help="fine-tuning steps (smoke runs); default: the config's")
    p.add_argument("--only", choices=("peer", "madr", "both"), default="both")
    p.add_argument("--out-dir", default="runs/pipeline_vs_peer")
    p.add_argument("--nodes", type=int, default=0,
                   help="run madr's stages as Ray jobs on a local cluster of this many worker nodes (0: each stage "
                        "on its own local Ray, as on one machine)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    out = Path(args.out_dir)
    catalog = Path(args.catalog) if args.catalog else sample_catalog(args.config, out / "sample_catalog")
    key = settings_key(catalog, args.config, args.set, args.steps)
    s = recipe(args.config, args.set, args.steps)
    sides: dict[str, dict] = {}
    if args.only in ("peer", "both"):
        sides["peer"] = side_result(out, f"pipeline_vs_peer-peer-{key}",
                                    lambda: measure_peer(catalog, s, out / f"peer-{key}"))
    if args.only in ("madr", "both"):
        madr = f"madr-{args.nodes}nodes-{key}" if args.nodes else f"madr-{key}"
        sides["madr"] = side_result(out, f"pipeline_vs_peer-{madr}", lambda: measure_madr(
            catalog, out / madr, args.config, args.set, args.steps, args.nodes))
    result = {"catalog": str(catalog), "settings": s, "command": run_command(MODULE), "machine": machine_line(),
              "versions": ", ".join(f"{k} {v}" for k, v in versions(
                  "torch", "transformers", "sentence_transformers", "faiss", "bm25s", "ray").items()),
              "load": load_average(), **sides}
    if len(sides) == 2:
        result["comparison"] = compare(sides["madr"], sides["peer"])
        print(f"-> {write_result_json(out, f'pipeline_vs_peer-{key}' + (f'-{args.nodes}nodes' if args.nodes else ''), result)}")
        print_report(result)
    return result


if __name__ == "__main__":
    from pipelines.runtime import exit_on_sigterm

    exit_on_sigterm()  # a SIGTERM stops a --nodes cluster through measure_madr's finally, as Ctrl-C does
    main()
