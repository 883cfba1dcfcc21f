"""A recommended index scaled to `--docs` documents with drawn ones, served through the deploy stage's Ray Serve
app, against one FastAPI process of sentence-transformers + FAISS (+ `bm25s` with the same fusion where the index
has a BM25 part): top-10 agreement with the offline search, then closed-loop p50 / p99 and queries/s per
`--concurrency` level (`--direct-ingress`: the co-located replica's port). The run is a product-search pipeline's
(fine-tuned e5, BM25 part and tuned fusion; the load: its test queries) or a multilingual one's (`recipe:
multilingual`: the multi-task teacher's index of held-out English candidates, its `serve:` query tower; the load:
the queries of its held-out click pairs).

    python -m benchmarks.speed.recipe_serving --run runs/product_search                        # 1M, the full run
    python -m benchmarks.speed.recipe_serving --run RUN --docs 20000 --duration 2 --tag smoke  # smoke
    python -m benchmarks.speed.recipe_serving --run ML_RUN --config configs/real/multilingual.yaml
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import scipy.sparse as sp
from pydantic import BaseModel

from benchmarks.common.config import ROOT, parser, write_result_json
from benchmarks.common.machine import load_average, machine_line, run_command, usable_cores, versions
from benchmarks.common.peer import bm25_index, bm25_search, dense_index, fuse, word_pieces
from benchmarks.common.process import child_env, module_command
from pipelines.jobs.local_cluster import free_port
from pipelines.runtime import apply_ray_env

apply_ray_env(offline=True)  # Ray network hygiene (scripts/ray_env.sh), before Ray is imported

MODULE = "benchmarks.speed.recipe_serving"
CHUNK = 100_000
NOISE, SEED = 0.5, 0  # a drawn vector's noise (x the real vectors' per-dimension std); the draws' and IVF's seed
PEER_MODEL, PEER_BM25 = "peer_model", "peer_bm25s"


def run_inputs(run: Path, config: str, serve_config: str) -> dict[str, Any]:
    """The run's index manifest, queries and the deploy stage's Serve application (args + deployments)."""
    from madr.config import load_config
    from madr.config_files import read_mapping
    from madr.layout import RunLayout
    from pipelines.evaluate.io import read_queries
    from pipelines.jobs.deploy import load_serve_config
    from pipelines.jobs.experiment import serve_args

    path = config if Path(config).is_file() else ROOT / config
    if read_mapping(path).get("recipe") == "multilingual":
        return multilingual_inputs(run, path, serve_config)
    cfg = load_config(path, {"output_dir": str(run.resolve())})
    layout = RunLayout.of(cfg)
    app = load_serve_config(str(ROOT / serve_config), serve_args(cfg))["applications"][0]
    queries = read_queries(layout.queries("eval")).column("text").to_pylist()
    return {"manifest": layout.manifest, "app": app, "queries": queries}


def multilingual_inputs(run: Path, config: Path, serve_config: str) -> dict[str, Any]:
    """A multilingual run's index manifest, the distinct queries of its held-out click pairs and its deploy stage's
    Serve application (the config's `serve:` section over the index's args)."""
    from pipelines.jobs.deploy import load_serve_config
    from pipelines.jobs.multilingual import serve_args
    from pipelines.multitask.config import load_pipeline_config
    from pipelines.multitask.data import read_data_stage

    cfg = load_pipeline_config(config, {"output_dir": str(run.resolve())})
    args = serve_args(cfg)
    app = load_serve_config(str(ROOT / serve_config), args)["applications"][0]
    queries = list(dict.fromkeys(r.query for r in read_data_stage(cfg).sets.clicks_eval))
    return {"manifest": Path(args["manifest_path"]), "app": app, "queries": queries}


def real_corpus(manifest_path: Path) -> dict[str, Any]:
    """The run's documents as stored: ids, vectors, display rows, model dir, and where the index has a BM25 part,
    its term counts, settings and tokenizer (else None)."""
    from madr.index.lexical import LexicalInfo, load_term_counts
    from madr.index.manifest import Manifest
    from madr.modeling.tokenization import load_tokenizer
    from madr.search.sharded import load_shard

    manifest, base = Manifest.load(manifest_path), manifest_path.parent
    shards = [load_shard(manifest_path, s.shard) for s in manifest.shards]
    model_dir = Path(manifest.model_dir)
    model_dir = model_dir if model_dir.is_absolute() else base / model_dir
    out = {"ids": np.concatenate([s.ids for s in shards]).astype(np.int64),
           "dense": np.concatenate([s.reconstruct(s.ids) for s in shards]), "tf": None, "lexical": None,
           "tokenizer": None, "docs": pq.read_table(base / manifest.docs_path), "manifest": manifest,
           "model_dir": model_dir}
    if manifest.has_lexical:
        lex = LexicalInfo.from_dict(manifest.lexical)
        out.update(lexical=lex, tokenizer=lex.tokenizer(base) or load_tokenizer(model_dir / "tokenizer"),
                   tf=sp.vstack([load_term_counts(base / s.lexical_path).to_scipy() for s in manifest.shards]).tocsr())
    return out


def draw_dense(real: np.ndarray, n: int, noise: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`n` vectors: a random real one (its row too) plus noise x the per-dimension std, unit when the real are."""
    std = real.std(axis=0).astype(np.float32)
    unit = bool(np.allclose(np.linalg.norm(real, axis=1), 1.0, atol=1e-3))
    src = rng.integers(0, real.shape[0], n)
    out = np.empty((n, real.shape[1]), np.float32)
    for a in range(0, n, CHUNK):
        x = real[src[a:a + CHUNK]] + noise * std * rng.standard_normal((min(CHUNK, n - a), real.shape[1]),
                                                                         dtype=np.float32)
        out[a:a + CHUNK] = x / np.linalg.norm(x, axis=1, keepdims=True) if unit else x
    return out, src


def draw_term_counts(tf, n: int, rng: np.random.Generator):
    """`n` word-piece documents (CSR): lengths drawn from the real ones, pieces from their unigram frequencies."""
    lengths = np.asarray(tf.sum(axis=1)).ravel().astype(np.int64)
    unigram = np.asarray(tf.sum(axis=0)).ravel().astype(np.float64)
    drawn_len = rng.choice(lengths, n)
    terms = rng.choice(tf.shape[1], size=int(drawn_len.sum()), p=unigram / unigram.sum())
    rows = np.repeat(np.arange(n), drawn_len)
    return sp.coo_array((np.ones(terms.size, np.float32), (rows, terms)), shape=(n, tf.shape[1])).tocsr()


def drawn_docs(docs, src: np.ndarray, ids: np.ndarray):
    """Display rows of drawn documents: their source document's fields under their own id (and product id)."""
    out = docs.take(pa.array(src)).set_column(docs.column_names.index("doc_id"), "doc_id", pa.array(ids, pa.int64()))
    if "product_id" in out.column_names:
        out = out.set_column(out.column_names.index("product_id"), "product_id",
                             pa.array([f"drawn-{i}" for i in ids.tolist()]))
    return out


def scaled_corpus(real: dict[str, Any], docs: int, noise: float, seed: int, out: Path) -> None:
    """The real documents plus drawn ones up to `docs`, ids ascending (with word pieces where the index has a BM25
    part), written to `out` (once)."""
    from madr.index.lexical import save_term_counts
    from madr.index.manifest import atomic_save_npy, atomic_write
    from madr.search.sparse import SparseBatch

    if (out / "docs.parquet").is_file():
        return
    order = np.argsort(real["ids"])
    ids, dense = real["ids"][order], real["dense"][order]
    extra = max(0, docs - ids.size)
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    more, src = draw_dense(dense, extra, noise, rng)
    new_ids = ids.max() + 1 + np.arange(extra, dtype=np.int64)
    table = real["docs"]
    by_id = dict(zip(table.column("doc_id").to_pylist(), range(table.num_rows), strict=True))
    table = table.take(pa.array([by_id[i] for i in ids.tolist()]))
    out.mkdir(parents=True, exist_ok=True)
    atomic_save_npy(out / "ids.npy", np.concatenate([ids, new_ids]))
    atomic_save_npy(out / "dense.npy", np.concatenate([dense, more]))
    del more
    if real["tf"] is not None:
        tf = real["tf"][order]
        lexical = sp.vstack([tf, draw_term_counts(tf, extra, rng)]).tocsr()
        save_term_counts(out / "lexical.npz", SparseBatch.from_scipy(lexical))
    rows = pa.concat_tables([table, drawn_docs(table, src, new_ids)])
    atomic_write(out / "docs.parquet", lambda tmp: pq.write_table(rows, tmp))
    print(f"corpus: {ids.size:,} real + {extra:,} drawn documents in {time.perf_counter() - t0:.1f} s", flush=True)


def build_scaled_index(real: dict[str, Any], corpus: Path, factory: str, seed: int) -> Path:
    """madr's index of the scaled corpus in `corpus/index`, laid out as the run's (shards; its BM25 part and fusion
    where it has one)."""
    from madr.index.build import build_index
    from madr.index.lexical import load_term_counts
    from madr.index.manifest import MANIFEST_FILE, record_fusion

    out, lex = corpus / "index", real["lexical"]
    if (out / MANIFEST_FILE).is_file():
        return out / MANIFEST_FILE
    t0 = time.perf_counter()
    bm25 = {} if lex is None else {"lexical": load_term_counts(corpus / "lexical.npz"),
                                   "fusion_lambda": lex.fusion_lambda, "lexical_tokenizer": real["tokenizer"]}
    path = build_index(np.load(corpus / "dense.npy"), np.load(corpus / "ids.npy"), out, len(real["manifest"].shards),
                       factory, model_dir=str(real["model_dir"]), docs=pq.read_table(corpus / "docs.parquet"),
                       seed=seed, **bm25)
    if lex is not None:
        record_fusion(path, lex.fusion_lambda, lex.normalisation)
    print(f"index built in {time.perf_counter() - t0:.1f} s", flush=True)
    return Path(path)


def prepare(args: argparse.Namespace, inputs: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """The scaled corpus, its madr index and the peer's sentence-transformers model, in the cache directory
    (`--cache`/<docs>-<hash of the input manifest, docs, seed, noise, index type>)."""
    real = real_corpus(inputs["manifest"])
    factory = args.index_factory or real["manifest"].index_factory
    key = hashlib.sha256(inputs["manifest"].read_bytes() + json.dumps([args.docs, SEED, NOISE, factory]).encode())
    out = Path(args.cache) / f"{args.docs}-{key.hexdigest()[:12]}"
    scaled_corpus(real, args.docs, NOISE, SEED, out)
    manifest = build_scaled_index(real, out, factory, SEED)
    if not (out / PEER_MODEL / "modules.json").is_file():
        from madr.export.sentence_transformers import export_sentence_transformers
        from madr.modeling.model import BiEncoder

        shutil.rmtree(out / PEER_MODEL, ignore_errors=True)  # an interrupted export
        export_sentence_transformers(BiEncoder.load(real["model_dir"]).eval(), out / PEER_MODEL)
    lex = real["lexical"]
    served = int(np.load(out / "ids.npy", mmap_mode="r").size)
    bm25 = ({"fusion_lambda": None, "normalisation": None, "k1": None, "b": None} if lex is None else
            {"fusion_lambda": lex.fusion_lambda, "normalisation": lex.normalisation, "k1": lex.k1, "b": lex.b})
    return manifest, {"real_docs": int(real["ids"].size), "docs_served": served, "index_factory": factory,
                      "shards": len(real["manifest"].shards), "model_dir": str(real["model_dir"]), **bm25,
                      "cache": str(out)}


def peer_bm25(corpus: Path, k1: float, b: float):
    """bm25s (Lucene idf) over the corpus's word-piece lists (term ids repeated by count), built once and saved."""
    import bm25s

    saved = corpus / PEER_BM25
    if not (saved / "params.index.json").is_file():
        with np.load(corpus / "lexical.npz") as f:
            indptr, terms, counts, vocab = f["indptr"], f["indices"], f["values"].astype(np.int64), int(f["vocab_size"])
        bounds = np.concatenate([[0], np.cumsum(counts)])[indptr]  # each document's first piece
        docs = [d.tolist() for d in np.split(np.repeat(terms, counts), bounds[1:-1])]
        bm25_index(docs, vocab, k1, b).save(str(saved))
    return bm25s.BM25.load(str(saved), load_vocab=True)


class PeerQuery(BaseModel):
    """The peer's request body."""

    query: str
    k: int = 10


def peer_app(corpus: Path, lam: float | None, how: str | None, candidates: int, k1: float | None, b: float | None,
             factory: str = "Flat", nprobe: int | None = None):
    """The hand-built service: POST /search {"query", "k"} -> results [{id, score, doc}] and timings_ms; BM25
    fused at `lam` (`how` normalisation), or the dense top k alone where `lam` is None (no BM25 part)."""
    from fastapi import FastAPI
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    model = SentenceTransformer(str(corpus / PEER_MODEL), device="cpu")
    ids, dense = np.load(corpus / "ids.npy"), np.load(corpus / "dense.npy", mmap_mode="r")
    flat = dense_index(dense, factory, nprobe)
    if lam is not None:
        tokenizer = AutoTokenizer.from_pretrained(str(corpus / "index" / "lexical_tokenizer"))
        bm25 = peer_bm25(corpus, k1, b)
    docs = pq.read_table(corpus / "docs.parquet")
    depth = min(candidates, ids.size)
    app = FastAPI()

    @app.get("/ready")
    def ready() -> dict:
        return {"ready": True}

    @app.post("/search")
    def search(q: PeerQuery) -> dict:
        t0 = time.perf_counter()
        vec = model.encode_query([q.query], convert_to_numpy=True, normalize_embeddings=True).astype(np.float32)
        t1 = time.perf_counter()
        d_scores, d_rows = flat.search(vec, depth if lam is not None else q.k)
        live = d_rows[0] >= 0
        rows, scores = d_rows[0][live], d_scores[0][live]
        if lam is not None:
            lexical = bm25_search(bm25, word_pieces(tokenizer, [q.query]), depth, ids.size)[0]
            rows, scores = fuse((rows, scores), lexical, lam, how, q.k)
        t2 = time.perf_counter()
        hits = docs.take(rows).to_pylist()
        results = [{"id": int(ids[r]), "score": float(s), "doc": h} for r, s, h in zip(rows, scores, hits,
                                                                                      strict=True)]
        t3 = time.perf_counter()
        return {"query": q.query, "k": q.k, "results": results,
                "timings_ms": {"encode": 1000 * (t1 - t0), "search": 1000 * (t2 - t1), "docs": 1000 * (t3 - t2)}}

    return app


def peer_from_env():
    """The peer app of `start_peer`'s spec ($PEER_SPEC; uvicorn's `--factory`), with its torch / FAISS threads
    (0: the libraries' defaults)."""
    spec = json.loads(os.environ["PEER_SPEC"])
    if threads := spec.pop("threads"):
        import faiss
        import torch

        torch.set_num_threads(threads)
        faiss.omp_set_num_threads(threads)
    return peer_app(Path(spec.pop("corpus")), **spec)


def start_peer(corpus: Path, info: dict[str, Any], search: Any, port: int, threads: int) -> subprocess.Popen:
    spec = {"corpus": str(corpus), "lam": info["fusion_lambda"], "how": info["normalisation"],
            "candidates": search.num_candidates, "k1": info["k1"], "b": info["b"],
            "factory": info["index_factory"], "nprobe": search.nprobe, "threads": threads}
    cmd = [*module_command("uvicorn"), f"{MODULE}:peer_from_env", "--factory", "--host", "127.0.0.1", "--port",
           str(port), "--log-level", "warning", "--no-access-log"]
    return subprocess.Popen(cmd, cwd=ROOT, env=child_env(PEER_SPEC=json.dumps(spec)))


SETTING_OF = {"QueryEncoder": "encoder", "SearchIngress": "ingress", "Colocated": "colocated"}


def madr_settings(app: dict[str, Any], manifest: Path, port: int):
    """`ServeSettings` of the deploy stage's application on `manifest` and `port`, its `deployments:` applied."""
    from serve.config import settings_from_dict
    from serve.placement import serve_config_deployments

    args = {**app["args"], "manifest_path": str(manifest), "port": port, "host": "127.0.0.1",
            "api_key_env": "MADR_BENCH_NO_KEY", "log_level": "WARNING", "access_log": False}
    settings = settings_from_dict(args)
    laid_out = serve_config_deployments({**app, "args": args})
    entries = {e["name"]: e for e in app.get("deployments") or []}
    for name, d in laid_out.items():
        extra = {k: entries.get(name, {})[k] for k in ("max_ongoing_requests", "max_queued_requests")
                 if k in entries.get(name, {})}
        field = SETTING_OF.get(name, "searcher")
        settings = dataclasses.replace(settings, **{field: dataclasses.replace(d, **extra)})
    return settings


def offline_top(manifest: Path, model_dir: str, settings, queries: list[str], k: int) -> np.ndarray:
    """madr's offline top k ids [Q, k] (`ShardedIndex`, the served search settings), each query encoded alone as a
    request is (no padding beside other queries)."""
    from madr.index import encode_queries
    from madr.modeling.model import BiEncoder
    from madr.search.sharded import ShardedIndex

    model, index = BiEncoder.load(model_dir).eval(), ShardedIndex.open(manifest)
    dense, _ = encode_queries(model, queries, batch_size=1)
    ids = index.search(dense, settings.search.replace(k=k), lexical=index.query_terms(model.tokenizer, queries))[1]
    del index
    gc.collect()
    return ids


def served_top(url: str, queries: list[str], k: int, attempts: int = 5) -> list[list[int]]:
    """Each query's top-k ids from `url`, one request at a time (a 503 / 504 with Retry-After retried)."""
    import requests

    def top(http: requests.Session, q: str) -> list[int]:
        for attempt in range(attempts):
            r = http.post(url + "/search", json={"query": q, "k": k}, timeout=60)
            if r.status_code == 200:
                return [h["id"] for h in r.json()["results"]]
            retry = r.headers.get("Retry-After")
            if r.status_code not in (503, 504) or retry is None or attempt == attempts - 1:
                raise RuntimeError(f"{url}/search {q!r}: HTTP {r.status_code}: {r.text[:300]}")
            time.sleep(float(retry))
        raise AssertionError("unreachable")

    with requests.Session() as http:
        return [top(http, q) for q in queries]


def agreement(reference: np.ndarray, got: list[list[int]]) -> dict[str, float]:
    """Queries whose top k equals the reference (same ids, same order) and mean overlap of the sets."""
    ref = [[int(i) for i in row if i >= 0] for row in reference]
    same = [r == g for r, g in zip(ref, got, strict=True)]
    overlap = [len(set(r) & set(g)) / max(len(r), 1) for r, g in zip(ref, got, strict=True)]
    return {"queries": len(ref), "identical": float(np.mean(same)), "overlap": float(np.mean(overlap))}


def ratios(results: dict[str, dict[int, dict]]) -> dict[int, dict[str, float]]:
    m, p = results["madr"], results["peer"]
    return {c: {"p50": m[c]["p50_ms"] / p[c]["p50_ms"], "p99": m[c]["p99_ms"] / p[c]["p99_ms"],
                "qps": m[c]["qps"] / p[c]["qps"]} for c in m}


def print_table(result: dict[str, Any]) -> None:
    info = result["index"]
    fusion = ("dense alone" if info["fusion_lambda"] is None else
              f"fusion lam {info['fusion_lambda']:g} {info['normalisation']}")
    print(f"\n{result['docs']:,} docs ({info['real_docs']:,} real), {info['index_factory']} in {info['shards']} "
          f"shards, {fusion}; load average at the end {result['load_average_end']}")
    for name, a in result["agreement"].items():
        print(f"top-10 agreement with madr offline, {name}: {a['identical']:.2f} identical, overlap "
              f"{a['overlap']:.3f} ({a['queries']} queries)")
    print("| concurrency | madr q/s | madr p50 / p99 ms | peer q/s | peer p50 / p99 ms | madr/peer p50 | madr/peer q/s |")
    print("|---|---|---|---|---|---|---|")
    for c, r in result["ratios"].items():
        m, p = result["results"]["madr"][c], result["results"]["peer"][c]
        print(f"| {c} | {m['qps']:.1f} | {m['p50_ms']:.1f} / {m['p99_ms']:.1f} | {p['qps']:.1f} | "
              f"{p['p50_ms']:.1f} / {p['p99_ms']:.1f} | {r['p50']:.2f}x | {r['qps']:.2f}x |")


def serve_both(args: argparse.Namespace, inputs: dict[str, Any], manifest: Path, info: dict[str, Any]) -> dict:
    """Offline reference, both apps up, agreement over HTTP, the load levels; Serve and the peer stopped after."""
    from benchmarks.speed.serve_api import measure_levels, start_serve, stop_apps, wait_ready

    settings = madr_settings(inputs["app"], manifest, free_port())
    if args.direct_ingress and settings.topology != "colocated":
        raise ValueError("--direct-ingress needs the co-located topology (a serve config with topology: colocated)")
    check = inputs["queries"][: args.check_queries]
    reference = offline_top(manifest, info["model_dir"], settings, check, 10)
    peer_port = free_port()
    peer = start_peer(manifest.parent.parent, info, settings.search, peer_port, args.peer_threads)
    try:
        t0 = time.perf_counter()
        served = start_serve(manifest, settings.port, [settings.topology], args.direct_ingress,
                             max(2, usable_cores()), **vars(settings))
        urls = {"madr": served["colocated-direct" if args.direct_ingress else settings.topology],
                "peer": f"http://127.0.0.1:{peer_port}"}
        wait_ready(urls["madr"], 600)
        wait_ready(urls["peer"], 1800, peer)
        print(f"both apps ready in {time.perf_counter() - t0:.1f} s", flush=True)
        agree = {name: agreement(reference, served_top(u, check, 10)) for name, u in urls.items()}
        levels = [int(c) for c in args.concurrency.split(",")]
        results = measure_levels(urls, inputs["queries"], levels, args.warmup, args.duration, alternate=True)
    finally:
        stop_apps(peer, 60)
    return {"agreement": agree, "results": results, "topology": settings.topology,
            "ingress": "direct" if args.direct_ingress else "proxy",
            "serve_settings": {"shard_groups": settings.shard_groups, "search": dataclasses.asdict(settings.search),
                               **{f: dataclasses.asdict(getattr(settings, f)) for f in
                                  ("encoder", "searcher", "ingress", "colocated")}}}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(MODULE, __doc__)
    p.add_argument("--run", required=True, help="the pipeline run's output directory (its output_dir)")
    p.add_argument("--config", default="configs/product_search.yaml", help="the run's experiment config")
    p.add_argument("--serve-config", default="serve/serve_config.yaml", help="the deploy stage's Serve config")
    p.add_argument("--docs", type=int, default=1_000_000, help="documents served: the real ones plus drawn ones")
    p.add_argument("--index-factory", default=None, help="FAISS index type (default: the run's)")
    p.add_argument("--cache", default=str(ROOT / "runs" / "bench_cache" / "recipe_serving"))
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--direct-ingress", action="store_true",
                   help="load the co-located replica's own port instead of Serve's proxy (serve.direct_ingress)")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--check-queries", type=int, default=50)
    p.add_argument("--peer-threads", type=int, default=1, help="torch / faiss threads (1, as a replica; 0: all)")
    p.add_argument("--out-dir", default=str(ROOT / "runs" / "benchmarks"))
    p.add_argument("--tag", default=None, help="result name (default: recipe_serving_<docs>)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = load_average()
    inputs = run_inputs(Path(args.run), args.config, args.serve_config)
    manifest, info = prepare(args, inputs)
    served = serve_both(args, inputs, manifest, info)
    result = {"benchmark": MODULE, "command": run_command(MODULE), "machine": machine_line(),
              "versions": versions("ray", "fastapi", "uvicorn", "torch", "faiss", "sentence_transformers", "bm25s",
                                   "numpy"),
              "load_average_start": started, "load_average_end": load_average(), "docs": args.docs,
              "run": str(Path(args.run).resolve()), "index": info, "duration_s": args.duration,
              "warmup_s": args.warmup, "peer_threads": args.peer_threads, "queries": len(inputs["queries"]),
              **served, "ratios": ratios(served["results"])}
    path = write_result_json(args.out_dir, args.tag or f"recipe_serving_{args.docs}", result)
    print_table(result)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    sys.exit(main())
