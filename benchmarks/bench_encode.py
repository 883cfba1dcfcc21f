"""End-to-end encode benchmark: text in (Parquet), index shards out, docs/s and peak memory.

Compared in the same run, on the same corpus and the same model weights (a tiny random BERT bi-encoder,
CLS + L2 norm; sized for the 2 shared cores of this machine):

- ``ray``:    ``pipelines.encode`` on a local Ray (read tasks -> tokenise actor -> encode actors -> shard
              tasks), Flat shards with the manifest; wall time from the job's start to its manifest.
- ``torch``:  a plain single-process loop: read the Parquet, ``model.encode_texts`` in batches of 128
              (tokenising included), ``IndexIDMap2(IndexFlatIP).add_with_ids``, ``write_index``.
- ``st``:     sentence-transformers ``encode`` of the same backbone (CLS pooling, normalised) + the same
              FAISS add (the issue's peer).

Each method runs in its own subprocess; peak memory is the peak of the summed RSS of that process and
all its children (Ray's raylet, GCS and workers included), sampled every 0.2 s. Two corpus sizes show
whether memory grows with the corpus: the baselines hold every vector, the job holds one shard per
finalising task. Prints machine, versions, docs/s, peak memory and the ratios.

    python benchmarks/bench_encode.py --sizes 10000 30000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TINY = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 256,
        "max_position_embeddings": 128}


class PeakRSS:
    """Peak of the summed RSS of this process and its descendants (sampled in a thread)."""

    def __init__(self, interval: float = 0.2) -> None:
        import psutil

        self.proc, self.interval, self.peak, self._stop = psutil.Process(), interval, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        total = 0
        for p in [self.proc, *self.proc.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except Exception:  # noqa: BLE001 (a process that just exited)
                pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            time.sleep(self.interval)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._sample())


def make_inputs(work: Path, n: int) -> tuple[Path, Path]:
    """A corpus of ``n`` synthetic products (Parquet files of 5,000 rows) and a tiny saved bi-encoder."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from madr.config import BackboneConfig, ModelConfig
    from madr.data.synthetic import generate_catalog
    from madr.model import build_model
    from madr.tokenization import train_wordpiece_tokenizer

    corpus, model_dir, tiny = work / f"corpus_{n}", work / "model", work / "corpus_tiny"
    catalog = generate_catalog(num_products=min(n, 10_000), num_queries=10, seed=0)
    titles = [p.title for p in catalog.products]
    descs = [p.description for p in catalog.products]
    if not corpus.exists():
        corpus.mkdir(parents=True)
        reps = -(-n // len(titles))
        t = pa.table({"doc_id": np.arange(n, dtype=np.int64), "title": (titles * reps)[:n],
                      "description": (descs * reps)[:n]})
        for i, start in enumerate(range(0, n, 5000)):
            pq.write_table(t.slice(start, 5000), corpus / f"part-{i:03d}.parquet")
    if not tiny.exists():
        tiny.mkdir(parents=True)
        pq.write_table(pa.table({"doc_id": np.arange(1024, dtype=np.int64), "title": titles[:1024],
                                 "description": descs[:1024]}), tiny / "part-000.parquet")
    if not model_dir.exists():
        tok = train_wordpiece_tokenizer(titles[:3000] + descs[:3000], vocab_size=4000, out_dir=str(work / "tok"))
        torch.manual_seed(0)
        cfg = ModelConfig(name="bibert", backbone=BackboneConfig(tiny=TINY), shared_towers=True,
                          max_query_length=32, max_doc_length=64)
        build_model(cfg, tok).save(model_dir)
    return corpus, model_dir


def _texts_ids(corpus: Path) -> tuple[list[str], np.ndarray]:
    import pyarrow.parquet as pq

    t = pq.read_table(corpus)
    texts = [f"{a} {b}".strip() for a, b in zip(t.column("title").to_pylist(), t.column("description").to_pylist(),
                                                  strict=True)]
    return texts, t.column("doc_id").to_numpy()


def _faiss_write(vecs: np.ndarray, ids: np.ndarray, out: Path) -> None:
    import faiss

    index = faiss.IndexIDMap2(faiss.IndexFlatIP(vecs.shape[1]))
    index.add_with_ids(np.ascontiguousarray(vecs, np.float32), ids)
    out.mkdir(parents=True, exist_ok=True)
    faiss.write_index(index, str(out / "flat.faiss"))


def child_torch(corpus: Path, model_dir: Path, out: Path, threads: int) -> dict:
    import torch

    from madr.model import BiEncoder

    torch.set_num_threads(threads)
    model = BiEncoder.load(model_dir).eval()
    start = time.perf_counter()
    texts, ids = _texts_ids(corpus)
    vecs = model.encode_texts(texts, "doc", batch_size=128).numpy()
    _faiss_write(vecs, ids, out)
    return {"seconds": time.perf_counter() - start}


def child_st(corpus: Path, model_dir: Path, out: Path, threads: int) -> dict:
    import torch
    from sentence_transformers import SentenceTransformer, models

    torch.set_num_threads(threads)
    word = models.Transformer(str(model_dir / "query_backbone"), max_seq_length=64,
                              tokenizer_name_or_path=str(model_dir / "tokenizer"))
    st = SentenceTransformer(modules=[word, models.Pooling(word.get_word_embedding_dimension(), "cls"),
                                      models.Normalize()], device="cpu")
    start = time.perf_counter()
    texts, ids = _texts_ids(corpus)
    vecs = st.encode(texts, batch_size=128, convert_to_numpy=True)
    _faiss_write(vecs, ids, out)
    return {"seconds": time.perf_counter() - start}


def child_ray(corpus: Path, model_dir: Path, out: Path, threads: int, shards: int = 4) -> dict:
    from pipelines.data.cli import init_ray
    from pipelines.encode.config import EncodeConfig
    from pipelines.encode.job import run_encode

    init_ray(threads)

    def job(inp: Path, dest: Path, n_shards: int) -> float:
        cfg = EncodeConfig(input=[str(inp)], output=str(dest), model_dir=str(model_dir),
                           text_columns=["title", "description"], num_shards=n_shards, index_factory="Flat",
                           store_docs=False, rows_per_read=1024, tokenize_actors=1, tokenize_cpus=0.5,
                           encode_actors=threads, encode_cpus=0.75, torch_threads=1, overwrite=True)
        start = time.perf_counter()
        run_encode(cfg, log=lambda _: None)
        return time.perf_counter() - start

    # the same job on one 1,024-row piece: its time is mostly the fixed cost of starting the actors
    # (new worker processes importing torch); the steady rate is measured after subtracting it
    small = job(corpus.parent / "corpus_tiny", out.parent / (out.name + "_tiny"), 1)
    seconds = job(corpus, out, shards)
    return {"seconds": seconds, "startup_s": small, "steady_docs_per_s": None}


CHILDREN = {"torch": child_torch, "st": child_st, "ray": child_ray}


def run_child(method: str, corpus: Path, model_dir: Path, out: Path, threads: int) -> dict:
    """Run one method in a fresh interpreter; returns its result with ``peak_rss_mb``."""
    cmd = [sys.executable, __file__, "--child", method, "--corpus", str(corpus), "--model", str(model_dir),
           "--out", str(out), "--threads", str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "RAY_DEDUP_LOGS": "1"})
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not line:
        raise RuntimeError(f"{method} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(line[-1][len("RESULT "):])


def versions() -> str:
    import faiss
    import ray
    import torch
    import transformers

    try:
        import sentence_transformers as st

        stv = st.__version__
    except ImportError:
        stv = "-"
    return (f"python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, "
            f"sentence-transformers {stv}, ray {ray.__version__}, faiss {faiss.__version__}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 30_000])
    ap.add_argument("--methods", nargs="+", default=["torch", "st", "ray"], choices=sorted(CHILDREN))
    ap.add_argument("--threads", type=int, default=2, help="CPU threads / Ray CPUs per method")
    ap.add_argument("--work", default="/tmp/madr_bench_encode")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--corpus", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        with PeakRSS() as mem:
            res = CHILDREN[args.child](Path(args.corpus), Path(args.model), Path(args.out), args.threads)
        res["peak_rss_mb"] = mem.peak / 2**20
        print("RESULT " + json.dumps(res), flush=True)
        return
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load avg {os.getloadavg()[0]:.1f}; {versions()}")
    print(f"model: random BERT {TINY['num_hidden_layers']} layers x {TINY['hidden_size']}, doc length 64; "
          f"{args.threads} threads per method; Flat index")
    rows = []
    for n in args.sizes:
        corpus, model_dir = make_inputs(work, n)
        for method in args.methods:
            res = run_child(method, corpus, model_dir, work / f"out_{method}_{n}", args.threads)
            if "startup_s" in res:  # rate without the fixed start-up (1,024 docs of the small run excluded too)
                res["steady_docs_per_s"] = (n - 1024) / max(res["seconds"] - res["startup_s"], 1e-9)
            rows.append({"docs": n, "method": method, "docs_per_s": n / res["seconds"], **res})
            extra = (f"  (start-up run {res['startup_s']:.1f} s; steady {res['steady_docs_per_s']:.0f} docs/s)"
                     if "startup_s" in res else "")
            print(f"  {n:>7} docs  {method:<6} {n / res['seconds']:>8.0f} docs/s  {res['seconds']:>7.1f} s  "
                  f"peak RSS {res['peak_rss_mb']:>7.0f} MB{extra}", flush=True)
    print("\nratios (ray / peer docs/s) and memory growth (largest / smallest corpus):")
    for n in args.sizes:
        by = {r["method"]: r for r in rows if r["docs"] == n}
        if "ray" in by:
            print(f"  {n:>7} docs: " + ", ".join(
                f"ray/{m} {by['ray']['docs_per_s'] / by[m]['docs_per_s']:.2f} end-to-end, "
                f"{by['ray']['steady_docs_per_s'] / by[m]['docs_per_s']:.2f} steady" for m in by if m != "ray"))
    for m in args.methods:
        mem = [r["peak_rss_mb"] for r in rows if r["method"] == m]
        print(f"  {m:<6} peak RSS {mem[0]:.0f} -> {mem[-1]:.0f} MB (x{mem[-1] / mem[0]:.2f} for "
              f"x{args.sizes[-1] / args.sizes[0]:.1f} docs)")


if __name__ == "__main__":
    main()
