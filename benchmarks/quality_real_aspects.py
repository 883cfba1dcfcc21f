"""Quality on REAL product search: the multi-aspect family vs dense baselines on Home Depot (issue 10; paper 000
Tables 4, 5 and 7, paper 001 Table 3).

Data (`homedepot:` of the config, `madr.data.sources.homedepot.write_homedepot_catalog`, cached under
`<output_dir>/catalog-<hash>`): the Home Depot relevance file as a catalog: unique products (title only) with
category / brand / colour from a title annotator, unique search terms split by term 70/10/20 into train / dev /
test, graded judgments 0-4 (raters' mean 1-3 -> round(2 (mean - 1))). Without a `homedepot:` section the
config's `data:` is used (a catalog directory or the synthetic generator: the smoke test).

Rows, every trained one from the SAME backbone weights (`model.backbone`), steps, batch, optimiser and seed;
the optional pretraining stage (`train.pretrain`, MLM + aspect losses) is off by default because the backbone
is already pretrained, the fine-tuning stage is paper 000 Eq. 8 (L_CE + in-batch L_SCE with one hard negative
+ `aspect_weight` x aspect losses for the aspect-learning models):
- references, not trained: BM25 on the backbone's word pieces (`madr.search.sparse.BM25Index`, Anserini k1/b) and the
  zero-shot backbone (`bench.zero_shot_pooling`: mean = all-MiniLM's own recipe, or cls = BiBERT untrained);
- BiBERT (CLS), MpBERT (first K tokens + Presence Weighting), MtBERT (CLS + aspect prediction), MADR and MADRAL
  (Aspect Extraction Network + fusion; MADRAL with aspect learning) with the three fusion networks (Weighted
  Sum, Presence Weighting, CLS-Gating; MADR with Presence Weighting, the paper's default), MUR and MURAL
  (aspect tokens + CLS-Gating; MURAL with multi-granularity aspect learning); DSSM on request (`--models`);
- ablations on request (`--models`): paper 000 Table 6 `madral_no_<aspect>`, `madral_no_other`,
  `madral_no_query` / `madral_no_doc` (aspect learning on one side only), relative to MADRAL (Presence
  Weighting); paper 001 Table 5 `mural_only_<aspect>` / `mural_only_<phrase|word|token>`, relative to MURAL.
Metrics on the test queries that have at least one product of relevance >= `eval.relevance_threshold`:
Recall@k over the WHOLE product corpus (exact search) and MRR@10 (paper 000 Recall@10k, paper 001 R@100 /
R@500: the corpus here is 41k products, so k = 10 / 100 / 1000), NDCG@k with gain 2^rel - 1 and per-query AUC
by re-ranking each query's judged products (paper 000 Sec. 8.3), aspect Accuracy@1 at phrase granularity for
the models that predict aspects (Table 5; queries: the test queries, documents: the whole corpus).
Significance: every row against BiBERT (Tables 4 / 3), every fusion against Weighted Sum (Table 7) and every
ablation against its full model (Tables 6 / 5), per metric, over the test queries: Student's paired t-test (the
papers' test; `bench.alpha`, paper 000 uses 0.01) and a two-sided paired randomisation test (sign flips,
`bench.draws`). With several seeds each seed is tested and so is the per-query mean over seeds (the table's
marks).

Budget on 2 CPU cores (measured with other work running): a fine-tuning step at batch 32 takes ~1.9 s (word
embeddings frozen, `bench.freeze_word_embeddings`; 2.9 s without), ~3.5 s for MUR / MURAL (9 aspect tokens);
the whole-corpus evaluation of one model takes ~200 s (41k titles in length-sorted batches at ~210/s), ~340 s
for MUR / MURAL. One seed of the default 11 rows: ~60 min, 38 of them encoding the corpus;
`--set bench.corpus_size=12000` (the test queries' judged products + a seeded sample) takes ~32 min.

    flock /tmp/madr_bench.lock python benchmarks/quality_real_aspects.py --threads 2        # the table
    python benchmarks/quality_real_aspects.py --seeds 0 1 2 --set bench.corpus_size=12000    # 3 seeds, ~95 min
    python benchmarks/quality_real_aspects.py --models bm25 bibert madral_pw --set bench.corpus_size=3000 \\
        --set train.finetune.steps=4 --set homedepot.max_queries=1000 --tag smoke           # quick look (2 min)
    python benchmarks/quality_real_aspects.py --seeds 0 --set bench.corpus_size=12000 --tag real_homedepot_ablations \
        --models bibert madral_pw mural madral_no_category madral_no_brand madral_no_color madral_no_other \
        madral_no_query madral_no_doc mural_only_category mural_only_brand mural_only_color mural_only_phrase \
        mural_only_word mural_only_token                                                   # Tables 6 / 5

Prints the tables (absolute values, relative change over BiBERT in %, fusions, aspect accuracy), machine,
versions and timings; writes <out-dir>/results/<tag>.json and <out-dir>/plots/<tag>.png (out-dir: benchmarks/)
after every seed. Each trained row's per-query result is kept in <output_dir>/seed<seed>/<row>/result.json with a
fingerprint of everything it depends on: a stopped run resumes at the next row, and adding a seed trains only it.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
from benchmarks.machine import load_average  # noqa: E402
from benchmarks.machine import machine_info as _machine_info  # noqa: E402
from benchmarks.plotting import pyplot, save_figure  # noqa: E402
from madr.config import ExperimentConfig, apply_overrides, config_hash, from_dict, parse_overrides  # noqa: E402
from madr.data.schema import Catalog  # noqa: E402
from madr.metrics import evaluate  # noqa: E402
from madr.modeling.model import BiEncoder, build_model, objective_keys  # noqa: E402
from madr.recipes.aspects.experiment import load_catalog, prepare_tokenizer, prepare_vocabularies  # noqa: E402
from madr.search.sparse.bm25 import BM25Index  # noqa: E402
from madr.training.loop import CatalogSampler, train_stage  # noqa: E402

# key -> (row label, ModelConfig fields over the config's `model:`)
ROWS: dict[str, tuple[str, dict[str, Any]]] = {
    "dssm": ("DSSM", {"name": "dssm"}),
    "bibert": ("BiBERT", {"name": "bibert"}),
    "mpbert": ("MpBERT", {"name": "mpbert", "fusion": "presence"}),
    "mtbert": ("MtBERT", {"name": "mtbert"}),
    "madr": ("MADR", {"name": "madr", "fusion": "presence"}),
    "madral_ws": ("MADRAL (Weighted Sum)", {"name": "madral", "fusion": "weighted_sum"}),
    "madral_pw": ("MADRAL (Presence Weighting)", {"name": "madral", "fusion": "presence"}),
    "madral_cls": ("MADRAL (CLS-Gating)", {"name": "madral", "fusion": "cls_gating"}),
    "mur": ("MUR", {"name": "mur"}),
    "mural": ("MURAL", {"name": "mural"}),
}
GRANULARITIES = ("phrase", "word", "token")


def ablation_rows(aspects: list[str]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Paper 000 Table 6: MADRAL (Presence Weighting) without one aspect, without OTHER, or with aspect learning
    on one side only; paper 001 Table 5: MURAL learning one aspect, or one granularity, only."""
    pw = {"name": "madral", "fusion": "presence"}
    rows = {f"madral_no_{a}": (f"MADRAL −{a}", {**pw, "aspects": [x for x in aspects if x != a]}) for a in aspects}
    rows["madral_no_other"] = ("MADRAL −other", {**pw, "use_other": False})
    rows["madral_no_query"] = ("MADRAL −query (aspect learning on documents only)", {**pw, "aspect_sides": ["doc"]})
    rows["madral_no_doc"] = ("MADRAL −doc (aspect learning on queries only)", {**pw, "aspect_sides": ["query"]})
    rows |= {f"mural_only_{a}": (f"MURAL only {a}", {"name": "mural", "aspects": [a]}) for a in aspects}
    rows |= {f"mural_only_{g}": (f"MURAL only {g}", {"name": "mural", "granularities": [g]}) for g in GRANULARITIES}
    return rows


def trained_rows(cfg: ExperimentConfig) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every trainable row for the config's aspects: the papers' models (ROWS) and the ablations."""
    return {**ROWS, **ablation_rows(list(cfg.model.aspects))}


ABLATION_BASES = {"madral_no_": "madral_pw", "mural_only_": "mural"}  # Table 6 / Table 5: relative to these
REFERENCES = {"bm25": "BM25 (word pieces)", "zero_shot": "Zero-shot backbone (untrained)"}
DEFAULT_MODELS = ["bm25", "zero_shot", "bibert", "mpbert", "mtbert", "madr", "madral_ws", "madral_pw",
                  "madral_cls", "mur", "mural"]
FUSIONS = ("madral_ws", "madral_pw", "madral_cls")  # Table 7 rows, relative to the first
MURAL_VS = ("madral_pw", "madr", "mur", "mural")  # paper 001 Table 3: the MURAL family relative to MADRAL (first)
BENCH_DEFAULTS: dict[str, Any] = {"seeds": [0], "models": DEFAULT_MODELS, "baseline": "bibert",
                                  "zero_shot_pooling": "mean", "freeze_word_embeddings": True,
                                  "corpus_size": None, "alpha": 0.01, "draws": 10000, "encode_batch_size": 256,
                                  "save_models": []}


def machine_info() -> dict[str, str]:
    return _machine_info(load_average=load_average())


# ---- config and data --------------------------------------------------------------------------------------------


def load_config(path: Path, sets: list[str]) -> tuple[dict | None, ExperimentConfig, dict]:
    """`homedepot:` -> write_homedepot_catalog arguments (path against the repository root), `bench:` -> the
    script's settings (BENCH_DEFAULTS), the rest -> ExperimentConfig; `--set key=value` overrides first."""
    data = yaml.safe_load(path.read_text()) or {}
    try:
        data = apply_overrides(data, parse_overrides(sets))
    except ValueError as err:
        raise SystemExit(str(err)) from None
    home = data.pop("homedepot", None)
    if home is not None:
        unknown = set(home) - {"path", "seed", "fractions", "max_queries"}
        if unknown or "path" not in home:
            raise SystemExit(f"{path}: homedepot: needs path and knows seed, fractions, max_queries; got {sorted(home)}")
        if not Path(home["path"]).is_absolute():
            home["path"] = str((ROOT / home["path"]).resolve())
    bench = {**BENCH_DEFAULTS, **(data.pop("bench", {}) or {})}
    unknown = set(bench) - set(BENCH_DEFAULTS)
    if unknown:
        raise SystemExit(f"{path}: unknown bench key(s) {sorted(unknown)}; known: {sorted(BENCH_DEFAULTS)}")
    if bench["zero_shot_pooling"] not in ("mean", "cls"):
        raise SystemExit(f"{path}: bench.zero_shot_pooling must be mean or cls, got {bench['zero_shot_pooling']!r}")
    cfg = from_dict(ExperimentConfig, data)
    if not Path(cfg.output_dir).is_absolute():
        cfg.output_dir = str(ROOT / cfg.output_dir)
    name = cfg.model.backbone.name_or_path
    if name and not name.startswith("pypi:") and not Path(name).is_absolute() and (ROOT / name).exists():
        cfg.model.backbone.name_or_path = str(ROOT / name)
    return home, cfg, bench


def catalog_for(home: dict | None, cfg: ExperimentConfig) -> Catalog:
    """The Home Depot catalog (written once per `homedepot:` settings and annotator code under the output dir),
    else `data:`."""
    if home is not None:
        from madr.data.sources import homedepot

        code = hashlib.sha256(Path(homedepot.__file__).read_bytes()).hexdigest()  # a changed annotator: rewrite
        where = Path(cfg.output_dir) / f"catalog-{config_hash({**home, 'code': code})}"
        if not (where / "judgments.parquet").is_file():
            t0 = time.perf_counter()
            args = {k: v for k, v in home.items() if k != "path"}
            if "fractions" in args:
                args["fractions"] = tuple(args["fractions"])
            homedepot.write_homedepot_catalog(Path(home["path"]), where, **args)
            print(f"wrote catalog {where} ({time.perf_counter() - t0:.0f} s)", flush=True)
        cfg.data.catalog_dir = str(where)
    return load_catalog(cfg)


@dataclass
class EvalSet:
    """The evaluated test queries (>= 1 relevant product), the whole corpus, and what the metrics need."""

    product_ids: list[str]
    doc_texts: list[str]
    doc_aspects: list[dict[str, list[str]]]
    query_ids: list[str]
    query_texts: list[str]
    query_aspects: list[dict[str, list[str]]]
    qrels: dict[str, dict[str, float]]
    judged: list[np.ndarray]  # per query: corpus rows of its judged products (qrels order)

    @classmethod
    def of(cls, catalog: Catalog, split: str, threshold: float, corpus_size: int | None = None,
           seed: int = 0) -> EvalSet:
        """`corpus_size` (None: every product) keeps the evaluated queries' judged products and a seeded
        sample of the others: a cheaper, smaller corpus for the retrieval metrics."""
        qrels_all = catalog.qrels(split)
        queries = [q for q in catalog.queries_in(split)
                   if any(r >= threshold for r in qrels_all.get(q.query_id, {}).values())]
        if not queries:
            raise SystemExit(f"no {split} query has a product of relevance >= {threshold}")
        qrels = {q.query_id: {pid: float(r) for pid, r in qrels_all[q.query_id].items()} for q in queries}
        products = list(catalog.products)
        if corpus_size is not None and corpus_size < len(products):
            judged = {pid for docs in qrels.values() for pid in docs}
            others = [p for p in products if p.product_id not in judged]
            rng = np.random.default_rng(seed)
            keep = judged | {others[i].product_id for i in rng.choice(
                len(others), max(0, min(len(others), corpus_size - len(judged))), replace=False)}
            products = [p for p in products if p.product_id in keep]
        row = {p.product_id: i for i, p in enumerate(products)}
        return cls([p.product_id for p in products], [catalog.product_text(p) for p in products],
                   [p.aspects for p in products], [q.query_id for q in queries], [q.text for q in queries],
                   [q.aspects for q in queries], qrels,
                   [np.array([row[pid] for pid in qrels[q.query_id]], dtype=np.int64) for q in queries])

    def summary(self, catalog: Catalog) -> dict[str, Any]:
        splits = {s: len(catalog.queries_in(s)) for s in ("train", "dev", "test")}
        grades = np.bincount([j.relevance for j in catalog.judgments], minlength=5).tolist()
        covered = {a: float(np.mean([bool(p.aspects.get(a)) for p in catalog.products])) for a in catalog.aspect_names}
        q_covered = {a: float(np.mean([bool(x.get(a)) for x in self.query_aspects])) for a in catalog.aspect_names}
        return {"products": len(catalog.products), "corpus": len(self.product_ids), "queries": splits, "judgments": len(catalog.judgments),
                "relevance_counts_0_to_4": grades, "evaluated_test_queries": len(self.query_ids),
                "judged_per_evaluated_query": float(np.mean([len(j) for j in self.judged])),
                "product_aspect_coverage": covered, "test_query_aspect_coverage": q_covered}


def token_lengths(tokenizer, texts: list[str], max_length: int) -> np.ndarray:
    """Word-piece lengths (truncated): encoding in length order wastes little on padding."""
    ids = tokenizer(texts, add_special_tokens=True, truncation=True, max_length=max_length)["input_ids"]
    return np.array([len(x) for x in ids])


def eval_lengths(tokenizer, ev: EvalSet, cfg: ExperimentConfig) -> dict[str, np.ndarray]:
    """`token_lengths` of the corpus ("doc") and of the queries ("query") at the model's maximum lengths."""
    return {"doc": token_lengths(tokenizer, ev.doc_texts, cfg.model.max_doc_length),
            "query": token_lengths(tokenizer, ev.query_texts, cfg.model.max_query_length)}


def prepare(home: dict | None, cfg: ExperimentConfig, bench: dict) -> tuple[Catalog, Any, Any, EvalSet]:
    """(catalog, tokenizer, aspect vocabularies, evaluation set): what every trained row shares."""
    catalog = catalog_for(home, cfg)
    tokenizer = prepare_tokenizer(cfg, catalog)
    vocab = prepare_vocabularies(cfg, catalog, tokenizer)
    return catalog, tokenizer, vocab, EvalSet.of(catalog, cfg.eval.split, cfg.eval.relevance_threshold,
                                                 bench["corpus_size"])


# ---- scoring ----------------------------------------------------------------------------------------------------


@torch.no_grad()
def encode(model: BiEncoder, texts: list[str], lengths: np.ndarray, side: str, batch_size: int,
           desc: str) -> tuple[torch.Tensor, dict[str, np.ndarray]]:
    """Search vectors [N, d] (L2-normalised for cosine models) and the top-1 phrase value of each aspect the
    model predicts, in ONE pass in length order."""
    model.eval()
    keys = [k for k, _, g in objective_keys(model.config) if g == "phrase"]
    order = np.argsort(lengths, kind="stable")
    emb = torch.empty(len(texts), model.embedding_dim)
    preds = {k: np.zeros(len(texts), dtype=np.int64) for k in keys}
    for start in tqdm(range(0, len(texts), batch_size), desc=desc, leave=False, mininterval=5):
        idx = order[start:start + batch_size]
        enc = model.tokenize([texts[i] for i in idx], side)
        out = model.encode(enc["input_ids"], enc["attention_mask"], side)
        e = out.embedding.float()
        emb[torch.from_numpy(idx)] = F.normalize(e, dim=-1) if model.config.similarity == "cosine" else e
        for k in keys:
            preds[k][idx] = out.aspect_logits[k].argmax(-1).numpy()
    return emb, preds


def dense_runs(q: torch.Tensor, d: torch.Tensor, ev: EvalSet, k: int, chunk: int = 256) -> tuple[dict, dict]:
    """(top-k run over the whole corpus, judged-products run) from query / document vectors."""
    run, rerank = {}, {}
    for s in range(0, len(q), chunk):
        sim = q[s:s + chunk] @ d.T
        top_s, top_i = torch.topk(sim, min(k, d.shape[0]), dim=1)
        for r in range(sim.shape[0]):
            qi = s + r
            qid = ev.query_ids[qi]
            run[qid] = dict(zip([ev.product_ids[i] for i in top_i[r].tolist()], top_s[r].tolist(), strict=True))
            judged = ev.judged[qi]
            rerank[qid] = dict(zip([ev.product_ids[i] for i in judged], sim[r, judged].tolist(), strict=True))
    return run, rerank


def bm25_runs(tokenizer, ev: EvalSet, k: int) -> tuple[dict, dict]:
    """BM25 over the word pieces of the corpus: top-k run and the judged-products run."""
    index = BM25Index().fit([tokenizer.tokenize(t) for t in ev.doc_texts])
    qs = [tokenizer.tokenize(t) for t in ev.query_texts]
    scores, ids = index.search(qs, k=k)
    run = {qid: {ev.product_ids[i]: float(s) for s, i in zip(srow, irow, strict=True) if i >= 0}
           for qid, srow, irow in zip(ev.query_ids, scores, ids, strict=True)}
    width = max(len(j) for j in ev.judged)
    judged = np.full((len(qs), width), -1, dtype=np.int64)
    for i, j in enumerate(ev.judged):
        judged[i, :len(j)] = j
    js = np.nan_to_num(index.index.score(index.encode_queries(qs), judged), neginf=0.0)
    rerank = {qid: dict(zip([ev.product_ids[i] for i in j], js[qi, :len(j)].tolist(), strict=True))
              for qi, (qid, j) in enumerate(zip(ev.query_ids, ev.judged, strict=True))}
    return run, rerank


def per_query_metrics(run: dict, rerank: dict, ev: EvalSet, cfg: ExperimentConfig) -> dict[str, dict[str, float]]:
    """{metric: {query id: value}}: retrieval metrics over the corpus run, re-ranking metrics over the judged."""
    e = cfg.eval
    out = evaluate(run, ev.qrels, e.retrieval_metrics, relevance_threshold=e.relevance_threshold, gains=e.gains,
                   per_query=True)
    out.update(evaluate(rerank, ev.qrels, e.rerank_metrics, relevance_threshold=e.relevance_threshold,
                        gains=e.gains, per_query=True))
    return out


def aspect_accuracy(model: BiEncoder, preds: dict[str, np.ndarray], aspects: list[dict], side: str) -> dict:
    """Accuracy@1 of the top phrase value per aspect over the items with an annotation in the vocabulary."""
    out = {}
    for key, aspect, _ in [x for x in objective_keys(model.config) if x[2] == "phrase"]:
        voc = model.vocabularies.get(aspect, "phrase")
        gold = [set(voc.encode(a.get(aspect, []))) for a in aspects]
        rows = [i for i, g in enumerate(gold) if g]
        if rows:
            out[f"{side}_acc@1_{aspect}"] = float(np.mean([int(preds[key][i]) in gold[i] for i in rows]))
    return out


def means(per_query: dict[str, dict[str, float]]) -> dict[str, float]:
    return {m: float(np.mean(list(v.values()))) if v else math.nan for m, v in per_query.items()}


# ---- rows -------------------------------------------------------------------------------------------------------


def search_depth(cfg: ExperimentConfig) -> int:
    """Documents retrieved per query: `eval.top_k`, at least the largest cutoff of the retrieval metrics."""
    return max([cfg.eval.top_k, *[int(m.split("@")[1]) for m in cfg.eval.retrieval_metrics if "@" in m]])


def model_config(cfg: ExperimentConfig, key: str):
    return dataclasses.replace(cfg.model, **trained_rows(cfg)[key][1])


def eval_model(model: BiEncoder, ev: EvalSet, lengths: dict[str, np.ndarray], cfg: ExperimentConfig, bs: int,
               label: str) -> tuple[dict, dict]:
    k = search_depth(cfg)
    d, d_preds = encode(model, ev.doc_texts, lengths["doc"], "doc", bs, f"{label}: corpus")
    q, q_preds = encode(model, ev.query_texts, lengths["query"], "query", bs, f"{label}: queries")
    pq = per_query_metrics(*dense_runs(q, d, ev, k), ev, cfg)
    acc = {}
    if model.vocabularies is not None and objective_keys(model.config):
        acc = {**aspect_accuracy(model, q_preds, ev.query_aspects, "query"),
               **aspect_accuracy(model, d_preds, ev.doc_aspects, "doc")}
    return pq, acc


def train_row(key: str, cfg: ExperimentConfig, catalog: Catalog, tokenizer, vocab, seed: int,
              freeze_embeddings: bool) -> tuple[BiEncoder, dict]:
    """Build row `key` from the shared start weights with torch seeded by `seed` (word embeddings frozen when
    `freeze_embeddings`), then pretrain (when `train.pretrain.steps` > 0; never DSSM, as `run_experiment`)
    and fine-tune on the train queries."""
    mcfg = model_config(cfg, key)
    torch.manual_seed(seed)
    model = build_model(mcfg, tokenizer, vocab)
    if freeze_embeddings:  # 12M of all-MiniLM's 23M weights; a third of the step time on 2 CPU cores
        for tower in model.towers():
            if tower.backbone is not None:
                tower.backbone.get_input_embeddings().weight.requires_grad_(False)
    sampler = CatalogSampler(catalog, "train", seed=seed)
    history = {}
    for kind, stage in (("pretrain", cfg.train.pretrain), ("finetune", cfg.train.finetune)):
        if stage.steps > 0 and not (kind == "pretrain" and mcfg.name == "dssm"):
            history[kind] = train_stage(model, sampler, stage, kind, seed=seed)
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


def label_of(key: str, bench: dict, cfg: ExperimentConfig) -> str:
    if key == "zero_shot":
        return f"Zero-shot backbone ({bench['zero_shot_pooling']} pooling, untrained)"
    return REFERENCES.get(key) or trained_rows(cfg)[key][0]


def row_fingerprint(key: str, seed: int, cfg: ExperimentConfig, ev: EvalSet, bench: dict) -> str:
    """What a row's result depends on: its model, training and evaluation settings, the data (a Home Depot
    catalog's directory name hashes the annotator code and split), the evaluated corpus, the seed and the
    frozen-embedding switch."""
    settings = {k: v for k, v in cfg.to_dict().items() if k not in ("name", "output_dir")}
    corpus = hashlib.sha256("\n".join(ev.product_ids).encode()).hexdigest()
    return config_hash({"row": key, "model": dataclasses.asdict(model_config(cfg, key)), "settings": settings,
                        "corpus": corpus, "seed": seed, "freeze_word_embeddings": bool(bench["freeze_word_embeddings"])})


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
    if saving:  # e.g. for benchmarks/case_study_explain.py
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


# ---- significance -----------------------------------------------------------------------------------------------


def paired_tests(a: dict[str, float], b: dict[str, float], draws: int, seed: int = 0) -> dict[str, float]:
    """Mean difference a - b over the shared queries, two-sided paired randomisation p (sign flips) and
    Student's paired t-test p."""
    keys = sorted(set(a) & set(b))
    diff = np.array([a[k] - b[k] for k in keys])
    if len(diff) == 0:
        return {"diff": math.nan, "p_randomisation": math.nan, "p_ttest": math.nan, "n": 0}
    rng = np.random.default_rng(seed)
    observed, hits, done = abs(diff.mean()), 0, 0
    while done < draws:  # chunks keep the sign matrix small
        n = min(1000, draws - done)
        signs = rng.choice((-1.0, 1.0), size=(n, len(diff)))
        hits += int(np.sum(np.abs(signs @ diff) / len(diff) >= observed - 1e-12))
        done += n
    p_t = math.nan
    if np.ptp(diff) > 1e-12 and len(diff) > 1:
        from scipy.stats import ttest_rel

        p_t = float(ttest_rel([a[k] for k in keys], [b[k] for k in keys]).pvalue)
    elif len(diff) > 1:  # a constant difference: t is 0 or infinite
        p_t = 1.0 if abs(diff.mean()) <= 1e-12 else 0.0
    return {"diff": float(diff.mean()), "p_randomisation": float((hits + 1) / (draws + 1)), "p_ttest": p_t,
            "n": len(diff)}


def significance(rows: dict[str, dict[str, dict[str, float]]], base: str, draws: int) -> dict[str, dict]:
    """{row: {metric: paired tests of row - base}} for every row but `base`."""
    return {key: {m: paired_tests(rows[key][m], rows[base][m], draws) for m in rows[base]}
            for key in rows if key != base and base in rows}


def seed_mean(runs: list[dict], shared: dict) -> dict[str, dict[str, dict[str, float]]]:
    """Per row and metric, the per-query value averaged over seeds (the references have one value)."""
    rows = dict(shared)
    for key in runs[0]["per_query"]:
        rows[key] = {m: {q: float(np.mean([r["per_query"][key][m][q] for r in runs])) for q in v}
                     for m, v in runs[0]["per_query"][key].items()}
    return rows


# ---- tables and plot --------------------------------------------------------------------------------------------


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


def aspect_table(order: list[str], labels: dict, acc: dict, aspects: list[str]) -> str:
    """Paper 000 Table 5: Accuracy@1 per aspect, queries then documents."""
    cols = [f"{side}_acc@1_{a}" for side in ("query", "doc") for a in aspects]
    lines = ["| Model | " + " | ".join(f"{c.split('_')[0]} {c.rsplit('_', 1)[1]}" for c in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for key in order:
        if acc.get(key):
            lines.append(f"| {labels[key]} | " + " | ".join(f"{acc[key][c]:.3f}" if c in acc[key] else "-"
                                                             for c in cols) + " |")
    return "\n".join(lines)


def plot(order: list[str], labels: dict, runs: list[dict], shared_means: dict, path: Path, title: str,
         metrics: tuple[str, ...], base: str) -> bool:
    """Bars of each metric per row: seed mean with the seeds' std, every seed as a dot, the baseline dashed;
    the y axis is zoomed on the values (re-ranking metrics of all rows lie within a few points)."""
    plt = pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 4.6))
    x = np.arange(len(order))
    for ax, m in zip(np.atleast_1d(axes), metrics, strict=True):
        vals = [[shared_means[k][m]] if k in shared_means else [means(r["per_query"][k])[m] for r in runs]
                for k in order]
        ax.bar(x, [np.mean(v) for v in vals], yerr=[np.std(v, ddof=1) if len(v) > 1 else 0 for v in vals],
               capsize=3, color=["#999999" if k in shared_means else "#4c72b0" for k in order])
        for i, v in enumerate(vals):
            ax.scatter([i] * len(v), v, s=8, color="black", zorder=3)
        if base in order:
            ax.axhline(np.mean(vals[order.index(base)]), color="#c44e52", lw=0.8, ls="--")
        flat = [x for v in vals for x in v]
        pad = max(0.02, 0.15 * (max(flat) - min(flat)))
        ax.set_ylim(max(0.0, min(flat) - 3 * pad), min(1.0, max(flat) + pad))
        ax.set_xticks(x, [labels[k].replace(" (", "\n(") for k in order], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel(f"test {header(m)}")
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(textwrap.fill(title, 150), fontsize=8)
    save_figure(fig, path, dpi=110)
    return True


# ---- report -----------------------------------------------------------------------------------------------------


@dataclass
class Invocation:
    """What every (partial) report of one run of the script shares."""

    cfg: ExperimentConfig
    home: dict | None
    bench: dict
    keys: list[str]             # rows in table order
    trained: list[str]          # the seeded rows among them
    labels: dict[str, str]
    sizes: dict[str, Any]       # EvalSet.summary + vocabulary sizes and token lengths
    shared: dict                # per-query metrics of the untrained reference rows
    shared_seconds: dict
    start: float                # perf_counter at the start
    load_before: str
    out_dir: Path
    tag: str


def aggregate(ctx: Invocation, runs: list[dict]) -> dict[str, Any]:
    """Per row: mean / std over seeds of the per-seed means, aspect accuracy; paired tests against the
    baseline (and fusions against Weighted Sum) on the seed-mean per query, and per seed."""
    shared_means = {k: means(v) for k, v in ctx.shared.items()}
    mean, std = dict(shared_means), {k: {m: 0.0 for m in v} for k, v in shared_means.items()}
    for key in ctx.trained if runs else []:
        per_seed = [means(r["per_query"][key]) for r in runs]
        mean[key] = {m: float(np.mean([s[m] for s in per_seed])) for m in per_seed[0]}
        std[key] = {m: float(np.std([s[m] for s in per_seed], ddof=1)) if len(per_seed) > 1 else 0.0
                    for m in per_seed[0]}
    acc = {key: {c: float(np.mean([r["aspects"][key][c] for r in runs])) for c in runs[0]["aspects"][key]}
           for key in ctx.trained} if runs else {}
    draws, base = int(ctx.bench["draws"]), ctx.bench["baseline"]
    pooled = seed_mean(runs, ctx.shared) if runs else dict(ctx.shared)
    tests = {"vs_baseline": significance(pooled, base, draws)}
    fusions = [k for k in FUSIONS if k in mean]
    if len(fusions) > 1:
        tests["fusion_vs_weighted_sum"] = significance({k: pooled[k] for k in fusions}, fusions[0], draws)
    family = [k for k in MURAL_VS if k in mean]
    if MURAL_VS[0] in family and len(family) > 1:
        tests["vs_madral"] = significance({k: pooled[k] for k in family}, MURAL_VS[0], draws)
    ablations = {}
    for prefix, ref in ABLATION_BASES.items():
        group = [k for k in mean if k.startswith(prefix)]
        if group and ref in mean:
            ablations[ref] = group
            tests[f"ablations_vs_{ref}"] = significance({k: pooled[k] for k in (ref, *group)}, ref, draws)
    per_seed_tests = {r["seed"]: significance({**ctx.shared, **r["per_query"]}, base, draws) for r in runs}
    return {"shared_means": shared_means, "mean": mean, "std": std, "aspect_accuracy": acc, "tests": tests,
            "tests_per_seed": per_seed_tests, "fusions": fusions, "family": family, "ablations": ablations}


def budget_text(cfg: ExperimentConfig) -> str:
    ft = cfg.train.finetune
    return (f"{ft.steps} fine-tune steps x batch {ft.batch_size} (+1 hard negative), lr {ft.learning_rate:g}, "
            f"aspect weight {ft.aspect_weight:g}" + (f"; pretrain {cfg.train.pretrain.steps} steps"
                                                     if cfg.train.pretrain.steps else "; no pretraining"))


def report_text(ctx: Invocation, agg: dict, seeds: list[int], metrics: list[str], source: str) -> str:
    """The tables in the papers' shapes and the paired tests, as printed and stored in the JSON."""
    cfg, labels, mean, tests = ctx.cfg, ctx.labels, agg["mean"], agg["tests"]
    base, alpha, fusions = ctx.bench["baseline"], float(ctx.bench["alpha"]), agg["fusions"]
    order = [k for k in ctx.keys if k in mean]
    text = [f"# {source} product search, {cfg.eval.split}: {ctx.sizes['evaluated_test_queries']} queries with a "
            f"product of relevance >= {cfg.eval.relevance_threshold:g}, corpus {ctx.sizes['corpus']} products; "
            f"backbone {cfg.model.backbone.name_or_path}, query/doc length {cfg.model.max_query_length}/"
            f"{cfg.model.max_doc_length}; {budget_text(cfg)}; seeds {seeds}",
            "\n## Values (paper 001 Table 3 shape; mean ± std over seeds)",
            value_table(order, labels, mean, agg["std"], metrics, set(ctx.trained))]
    if base in mean:
        text += [f"\n## Relative to {labels[base]} (paper 000 Table 4 shape; † paired t-test p < {alpha:g} on the "
                 f"seed-mean per query)", relative_table(order, labels, mean, metrics, base, tests["vs_baseline"],
                                                         alpha)]
    if len(fusions) > 1:
        text += [f"\n## Fusion networks relative to {labels[fusions[0]]} (paper 000 Table 7 shape)",
                 relative_table(fusions, labels, mean, metrics, fusions[0], tests["fusion_vs_weighted_sum"], alpha)]
    if "vs_madral" in tests:
        text += [f"\n## Relative to {labels[MURAL_VS[0]]} (paper 001 Table 3 shape; † paired t-test p < {alpha:g})",
                 relative_table(agg["family"], labels, mean, metrics, MURAL_VS[0], tests["vs_madral"], alpha)]
    for ref, group in agg["ablations"].items():
        shape = "paper 000 Table 6" if ref.startswith("madral") else "paper 001 Table 5"
        rows = [ref, *group] + ([base] if base in mean else [])
        text += [f"\n## Ablations relative to {labels[ref]} ({shape} shape; † paired t-test p < {alpha:g})",
                 relative_table(rows, labels, mean, metrics, ref, tests[f"ablations_vs_{ref}"], alpha)]
    if any(agg["aspect_accuracy"].values()):
        text += ["\n## Aspect Accuracy@1 (paper 000 Table 5 shape; phrase values)",
                 aspect_table(order, labels, agg["aspect_accuracy"], list(cfg.model.aspects))]
    if tests["vs_baseline"]:
        text.append(f"\n## Paired tests vs {labels.get(base, base)} (seed-mean per query): diff, p_t, p_rand")
        for key, t in tests["vs_baseline"].items():
            text.append(f"{labels[key]}: " + "; ".join(
                f"{header(m)} {v['diff']:+.4f} (p_t {v['p_ttest']:.2g}, p_rand {v['p_randomisation']:.2g})"
                for m, v in t.items()))
    return "\n".join(text)


def publish(ctx: Invocation, runs: list[dict]) -> dict[str, Any]:
    """Aggregate the seeds done so far; print the tables, machine and timings; write <tag>.json and <tag>.png."""
    cfg, seeds = ctx.cfg, [r["seed"] for r in runs]
    metrics = list(cfg.eval.retrieval_metrics) + list(cfg.eval.rerank_metrics)
    agg = aggregate(ctx, runs)
    source = "Home Depot" if ctx.home is not None else Path(cfg.data.catalog_dir or "synthetic catalog").name
    seconds = {**ctx.shared_seconds, **{f"seed{r['seed']} {k}": v for r in runs for k, v in r["seconds"].items()}}
    info = machine_info()
    table_text = "\n".join([
        report_text(ctx, agg, seeds, metrics, source),
        "\nmachine: " + "; ".join(f"{k} {v}" for k, v in info.items()) + f"; load before {ctx.load_before}",
        "seconds: " + ", ".join(f"{k} " + "/".join(f"{x:.0f}" for x in v.values()) for k, v in seconds.items())])
    print(table_text, flush=True)
    result = {"benchmark": "quality_real_aspects", "command": " ".join(["python", *sys.argv]),
              "config": {"homedepot": ctx.home, "bench": ctx.bench, **cfg.to_dict()}, "rows": ctx.labels,
              "trained_rows": ctx.trained, "seeds": seeds, "data": ctx.sizes, "machine": info,
              "load_average_before": ctx.load_before, "wall_s": time.perf_counter() - ctx.start,
              "seconds": seconds, "metrics": metrics, "mean": agg["mean"], "std": agg["std"],
              "aspect_accuracy": agg["aspect_accuracy"],
              "per_seed": {r["seed"]: {k: {**means(v), **r["aspects"][k]} for k, v in r["per_query"].items()}
                           for r in runs},
              "training": {r["seed"]: r["training"] for r in runs}, "tests": agg["tests"],
              "tests_per_seed": agg["tests_per_seed"], "table": table_text}
    json_path = ctx.out_dir / "results" / f"{ctx.tag}.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=1, default=float))
    png = ctx.out_dir / "plots" / f"{ctx.tag}.png"
    title = (f"{source} {cfg.eval.split} ({ctx.sizes['evaluated_test_queries']} queries, corpus "
             f"{ctx.sizes['corpus']}); {Path(str(cfg.model.backbone.name_or_path)).name}; {budget_text(cfg)}; "
             f"seeds {seeds}")
    plot_metrics = tuple(m for m in ("recall@100", "ndcg@10") if m in metrics) or tuple(metrics[:2])
    order = [k for k in ctx.keys if k in agg["mean"]]
    if plot(order, ctx.labels, runs, agg["shared_means"], png, title, plot_metrics, ctx.bench["baseline"]):
        print(f"wrote {png}")
    print(f"wrote {json_path} ({result['wall_s']:.0f} s; load {ctx.load_before} -> {info['load_average']})")
    return result


# ---- main -------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "real" / "homedepot.yaml"))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="dotted override (repeatable)")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="training seeds (default: bench.seeds)")
    p.add_argument("--models", nargs="+", default=None, metavar="ROW",
                   help=f"rows (default: bench.models); known: {', '.join([*REFERENCES, *ROWS])} and the "
                        "ablations madral_no_<aspect|other|query|doc>, mural_only_<aspect|phrase|word|token>")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--tag", default="real_homedepot_aspects", help="name of the JSON / PNG")
    p.add_argument("--out-dir", default=str(ROOT / "benchmarks"), help="results/ and plots/ go under it")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    home, cfg, bench = load_config(Path(args.config), args.set)
    seeds = list(args.seeds if args.seeds is not None else bench["seeds"])
    keys = list(dict.fromkeys(args.models if args.models is not None else bench["models"]))
    known = trained_rows(cfg)
    unknown = [k for k in keys if k not in known and k not in REFERENCES]
    if unknown:
        raise SystemExit(f"unknown row(s) {unknown}; known: {', '.join([*REFERENCES, *known])}")
    trained = [k for k in keys if k in known]
    refs = [k for k in keys if k in REFERENCES]
    start, load_before = time.perf_counter(), machine_info()["load_average"]

    Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
    catalog, tokenizer, vocab, ev = prepare(home, cfg, bench)
    sizes = ev.summary(catalog)
    sizes["aspect_vocabulary_phrases"] = {a: len(vocab.get(a, "phrase")) for a in cfg.model.aspects}
    lengths = eval_lengths(tokenizer, ev, cfg)
    sizes["mean_tokens"] = {side: float(v.mean()) for side, v in lengths.items()}
    print("data: " + json.dumps(sizes), flush=True)
    labels = {k: label_of(k, bench, cfg) for k in keys}

    shared, shared_seconds = reference_rows(refs, cfg, ev, tokenizer, lengths, bench)
    ctx = Invocation(cfg, home, bench, keys, trained, labels, sizes, shared, shared_seconds, start, load_before,
                     Path(args.out_dir), args.tag)
    runs: list[dict] = []
    result = publish(ctx, runs) if not trained else {}
    for seed in seeds:  # the report is rewritten after every seed: a long run leaves its partial result behind
        runs.append(run_seed(trained, cfg, catalog, ev, tokenizer, vocab, lengths, seed, bench))
        result = publish(ctx, runs)
    return result


if __name__ == "__main__":
    main()
