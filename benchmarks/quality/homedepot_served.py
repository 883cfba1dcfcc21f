"""The served configuration of `benchmarks.quality.homedepot_hybrid` through the system (issue 26 item 1): the
trained model saved by that benchmark is indexed by the encode job with `lexical: bm25` (sharded FAISS + BM25
on the model's own word pieces, `fusion_lambda` = the dense weight the benchmark chose on dev), the test
queries are answered by `ShardedIndex` fused search (`pipelines.evaluate.searcher.search_texts`, what the
evaluate stage and Ray Serve `/search` call), and the metrics are set beside the benchmark's in-script row
("BM25 (model pieces) + BiBERT (trained)") over the same corpus: equal up to float rounding when the system
does what the benchmark measured.

    python -m benchmarks.quality.homedepot_served --seed 0                  # in process (the job's local mode)
    python -m benchmarks.quality.homedepot_served --seed 0 --ray            # the encode job on local Ray
    python -m benchmarks.quality.homedepot_served --seed 0 --dtype int8     # documents encoded with int8 weights

Each metric of the served path is paired with the in-script row query by query (`benchmarks.common.stats.
paired_tests`): no difference when the system serves what the benchmark measured; with `--dtype int8` (the
encode job's `encode.dtype`) the test says what int8 documents cost.

Reads the benchmark's config (`--config`, `--set` as there) and results JSON (`--results`); writes the corpus
Parquet and the index under <output_dir>/served-seed<seed>/ and <out-dir>/results/<tag>.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.common.config import RESULTS, ROOT, RUN_OUT, add_run_args
from benchmarks.common.machine import machine_info, run_command
from benchmarks.common.stats import paired_tests
from benchmarks.quality.aspect_models.data import EvalSet, catalog_for
from benchmarks.quality.aspect_models.evaluation import Lists
from benchmarks.quality.fusion_lists import fuse, retrieval_per_query
from benchmarks.quality.homedepot_hybrid import load
from madr.search.params import SearchParams


def served_row_weight(results: dict, seed: int, row: str, lexical: str) -> tuple[float, str]:
    """The dense weight and the normalisation (min-max when the JSON names none) of "<lexical BM25 row> + <row>"
    chosen on dev in the benchmark's run."""
    fused = results["training"][str(seed)][f"{lexical}+{row}"]
    return float(fused["weights"][-1]), str(fused.get("normalisation", "minmax"))


def write_corpus(ev: EvalSet, path: Path) -> Path:
    """The evaluated corpus as the encode job reads it: doc_id (row), product_id, title."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"doc_id": np.arange(len(ev.product_ids), dtype=np.int64),
                             "product_id": ev.product_ids, "title": ev.doc_texts}), path)
    return path


def in_script_metrics(lists_dir: Path, lexical: str, row: str, seed: int, lam: float, ev: EvalSet, cfg, k: int,
                      normalisation: str = "minmax") -> dict[str, dict[str, float]]:
    """The benchmark's row per query, recomputed from its cached lists: the `lexical` BM25 row's and the trained
    row's lists, fused with the same weights."""
    parts = []
    for name in (lexical, f"{row}@{seed}"):
        with np.load(lists_dir / f"{name}.npz", allow_pickle=False) as z:
            parts.append(Lists(z["test_scores"], z["test_ids"], z["test_judged"]))
    fused = fuse(parts, [1.0 - lam, lam], k, normalisation)
    return retrieval_per_query(fused.scores, fused.ids, ev, cfg, cfg.eval.retrieval_metrics)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(p, ROOT / "configs" / "real" / "homedepot_hybrid.yaml", "real_homedepot_served", seeds=[0])
    p.add_argument("--results", default=str(RESULTS / "real_homedepot_hybrid.json"))
    p.add_argument("--row", default="bibert", help="the trained row whose saved model is served")
    p.add_argument("--ray", action="store_true", help="run the encode job on a local Ray cluster")
    p.add_argument("--lexical-tokenizer", default=None, metavar="TOKENIZER",
                   help="the index's BM25 tokenizer (index.lexical_tokenizer; default: the model's own, the "
                        "benchmark's bm25_model row); bench.lexical_tokenizer matches its bm25 row")
    p.add_argument("--dtype", default="auto", help="the encode job's encode.dtype (e.g. int8: int8 weights)")
    p.add_argument("--out-dir", default=str(RUN_OUT))
    args = p.parse_args(argv)
    from madr.encode_config import EncodeConfig
    from pipelines.encode.job import run_encode
    from pipelines.evaluate.searcher import SearchSpec, search_texts

    home, cfg, bench = load(Path(args.config), args.set)
    seed, k = args.seeds[0], int(cfg.eval.top_k)
    ev = EvalSet.of(catalog_for(home, cfg), "test", cfg.eval.relevance_threshold, bench["corpus_size"])
    results = json.loads(Path(args.results).read_text())
    lexical = "bm25_model" if args.lexical_tokenizer is None else "bm25"
    lam, norm = served_row_weight(results, seed, args.row, lexical)
    where = Path(cfg.output_dir) / (f"served-seed{seed}-{lexical}{'' if norm == 'minmax' else '-' + norm}"
                                    f"{'' if args.dtype == 'auto' else '-' + args.dtype}")
    model_dir = Path(cfg.output_dir) / f"seed{seed}" / args.row / "model"
    if args.ray:
        from pipelines.runtime import init_ray

        init_ray()
    t0 = time.perf_counter()
    job = EncodeConfig(input=[str(write_corpus(ev, where / "corpus" / "titles.parquet"))], output=str(where / "index"),
                       model_dir=str(model_dir), text_columns=["title"], external_id_column="product_id",
                       num_shards=2, index_factory="Flat", lexical="bm25", fusion_lambda=lam, store_docs=True,
                       lexical_tokenizer=args.lexical_tokenizer, dtype=args.dtype, overwrite=True)
    run_encode(job, local=not args.ray)
    encode_s = time.perf_counter() - t0
    from madr.modeling.model import BiEncoder
    from madr.search.sharded import ShardedIndex

    model, index = BiEncoder.load(model_dir).eval(), ShardedIndex.open(where / "index")
    t1 = time.perf_counter()
    scores, ids = search_texts(model, index, ev.query_texts, k, SearchSpec(search=SearchParams(k=k, candidates=k, normalisation=norm)))
    search_s = time.perf_counter() - t1
    served_q = retrieval_per_query(scores, ids, ev, cfg, cfg.eval.retrieval_metrics)
    in_script_q = in_script_metrics(Path(cfg.output_dir) / "lists", lexical, args.row, seed, lam, ev, cfg, k, norm)
    served, in_script = ({m: float(np.mean(list(v.values()))) for m, v in q.items()} for q in (served_q, in_script_q))
    tests = {m: paired_tests(served_q[m], in_script_q[m]) for m in served}
    table = ["| path | " + " | ".join(served) + " |", "|---" * (len(served) + 1) + "|",
             "| benchmark (in script) | " + " | ".join(f"{in_script[m]:.4f}" for m in served) + " |",
             f"| encode job (dtype {args.dtype}) -> ShardedIndex fused search | "
             + " | ".join(f"{served[m]:.4f}" for m in served) + " |",
             "| served - in script (paired t-test p) | "
             + " | ".join(f"{tests[m]['diff']:+.4f} (p {tests[m]['p_ttest']:.2g})" for m in served) + " |"]
    text = (f"# served configuration, seed {seed}: {model_dir}, BM25 on {args.lexical_tokenizer or 'the model'}'s "
            f"pieces, lam {lam:g} (dense), {norm} normalisation, {len(ev.product_ids)} docs, "
            f"{len(ev.query_ids)} test queries; encode job {encode_s:.0f} s ({'Ray' if args.ray else 'in process'}, "
            f"dtype {args.dtype}), search {search_s:.1f} s\n" + "\n".join(table))
    print(text, flush=True)
    out = {"benchmark": __spec__.name, "command": run_command(__spec__.name), "seed": seed, "lam": lam, "normalisation": norm,
           "dtype": args.dtype, "served": served, "in_script": in_script, "tests": tests, "encode_s": encode_s,
           "search_s": search_s, "machine": machine_info(), "table": text}
    path = Path(args.out_dir) / "results" / f"{args.tag}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
