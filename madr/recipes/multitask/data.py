"""The experiment's data (step 1 of `madr.recipes.multitask.experiment`): a position-biased click log over a
synthetic catalog, NLI pairs and WikiMatrix-like parallel pairs with their held-out splits, and the text
views of them (training texts, query-side texts, click documents as one text)."""

from __future__ import annotations

from collections.abc import Sequence

from madr.data.records import ClickRecord, MultilingualData
from madr.data.synthetic.catalog import generate_catalog
from madr.data.synthetic.multilingual import (
    click_log_from_catalog,
    filter_parallel,
    generate_nli,
    generate_parallel,
)
from madr.modeling.heads.field_attention import concat_fields
from madr.recipes.multitask.config import MultiTaskExperimentConfig

DOC_SEP = " "  # fields joined for the click documents (the tokenizer has no use for a literal "[SEP]" text)
HELD_OUT_SEED_OFFSET = 1_000_003


def build_data(cfg: MultiTaskExperimentConfig) -> MultilingualData:
    """The three synthetic sources with their train / held-out splits (see `MultilingualDataConfig`)."""
    d = cfg.data
    catalog = generate_catalog(d.click_products, d.click_queries, seed=d.seed, languages=d.click_languages)
    log_records = click_log_from_catalog(catalog, d.docs_per_query, d.seed, d.position_bias, d.ranker_noise,
                                         d.click_noise, d.impressions_per_query)
    split = {q.query_id: q.split for q in catalog.queries}
    clicks_train = [r for r in log_records if split[r.query_id] == "train"]
    clicks_eval = [r for r in log_records if split[r.query_id] == d.eval_split]
    held_seed = d.seed + HELD_OUT_SEED_OFFSET
    nli_train = generate_nli(d.nli_train, d.nli_languages, seed=d.seed)
    seen_pairs = {(r.premise, r.hypothesis) for r in nli_train}
    nli_eval = [r for r in generate_nli(d.nli_eval, d.nli_languages, seed=held_seed)
                if (r.premise, r.hypothesis) not in seen_pairs]
    parallel = generate_parallel(d.parallel_train, d.parallel_languages, seed=d.seed, noise_rate=d.parallel_noise_rate)
    if d.parallel_threshold is not None:
        parallel = filter_parallel(parallel, d.parallel_threshold)
    seen_english = {r.target for r in parallel}
    parallel_eval = [r for r in generate_parallel(d.parallel_eval, d.parallel_languages, seed=held_seed, noise_rate=0.0)
                     if r.target not in seen_english]
    data = MultilingualData(clicks_train, clicks_eval, nli_train, nli_eval, parallel, parallel_eval)
    _check_data(data)
    return data


def _check_data(data: MultilingualData) -> None:
    empty = [name for name, n in data.sizes().items() if n == 0]
    if empty:
        raise ValueError(f"multitask data: empty set(s) {empty}; raise the data sizes in the config")


def doc_text(record: ClickRecord, order: Sequence[str]) -> str:
    """The click document as one text: its fields in `order` (concatenation, paper 004 Sec. IV)."""
    return concat_fields(record.fields, order, DOC_SEP)


def training_texts(data: MultilingualData, order: Sequence[str]) -> list[str]:
    """Every training text (never a held-out one): what an in-process tokenizer is trained on."""
    texts = [r.query for r in data.clicks_train] + [doc_text(r, order) for r in data.clicks_train]
    texts += [t for r in data.nli_train for t in (r.premise, r.hypothesis)]
    return texts + [t for r in data.parallel_train for t in (r.source, r.target)]


def query_side_texts(data: MultilingualData) -> list[str]:
    """Training texts that go through the query tower: what the student is distilled on."""
    texts = [r.query for r in data.clicks_train] + [r.hypothesis for r in data.nli_train]
    texts += [r.premise for r in data.nli_train] + [r.source for r in data.parallel_train]
    return list(dict.fromkeys(texts + [r.target for r in data.parallel_train]))


def doc_side_texts(data: MultilingualData, order: Sequence[str]) -> list[str]:
    """Training texts that go through the document tower (click documents, premises, English sentences)."""
    texts = [doc_text(r, order) for r in data.clicks_train] + [r.premise for r in data.nli_train]
    return list(dict.fromkeys(texts + [r.target for r in data.parallel_train]))


def held_out_doc_texts(data: MultilingualData, order: Sequence[str]) -> list[str]:
    texts = [doc_text(r, order) for r in data.clicks_eval] + [r.premise for r in data.nli_eval]
    return list(dict.fromkeys(texts + [r.target for r in data.parallel_eval]))


def held_out_query_texts(data: MultilingualData) -> list[str]:
    texts = [r.query for r in data.clicks_eval] + [r.hypothesis for r in data.nli_eval]
    return list(dict.fromkeys(texts + [r.source for r in data.parallel_eval]))
