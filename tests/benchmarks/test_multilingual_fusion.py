"""BM25 + embedder fusion of the multilingual benchmark (benchmarks.quality.multilingual_fusion): the weight
is chosen on held-in items and follows whichever signal is informative there."""

from __future__ import annotations

import numpy as np
import torch

from benchmarks.quality.multilingual_fusion import fused_rows, held_in_sample
from madr.data.records import ClickRecord, MultilingualData, NLIRecord, ParallelRecord

WORDS = ["apple", "river", "stone", "cloud", "music", "garden", "window", "bridge", "forest", "candle", "mirror",
         "silver", "harbor", "violet", "meadow", "thunder"]


def _data() -> MultilingualData:
    """Click pairs whose clicked ads repeat the query word (BM25 finds them) and parallel pairs whose source
    shares no word piece with its English side (only an aligned embedder finds them)."""
    def clicks(offset: int) -> list[ClickRecord]:
        out = []
        for i, w in enumerate(WORDS):
            other = WORDS[(i + 5 + offset) % len(WORDS)]
            out.append(ClickRecord(w, {"title": f"{w} shop"}, True, query_id=f"q{i}", doc_id=f"a{i}", relevance=1))
            out.append(ClickRecord(w, {"title": f"{other} shop"}, False, query_id=f"q{i}", doc_id=f"b{i}", relevance=0))
        return out

    pairs = [ParallelRecord(f"zz{i}", w, "xxx") for i, w in enumerate(WORDS)]
    nli = [NLIRecord("a", "b", "entailment")]
    return MultilingualData(clicks(0), clicks(3), nli, nli, pairs[:8], pairs[8:])


def aligned_embedder(texts: list[str], role: str) -> torch.Tensor:
    """Source `zz<i>` and English word i map to the same one-hot; every other text to a random unit vector."""
    rng = np.random.default_rng(len(texts))
    out = []
    for t in texts:
        key = int(t[2:]) if t.startswith("zz") else (WORDS.index(t) if t in WORDS else None)
        v = np.eye(32)[key] if key is not None else rng.normal(size=32)
        out.append(v / np.linalg.norm(v))
    return torch.tensor(np.array(out), dtype=torch.float32)


def test_weights_follow_the_informative_signal_on_held_in_items(tokenizer):
    data = _data()
    bench = {"fusion_held_in_clicks": 32, "fusion_held_in_per_language": 8}
    out = fused_rows(aligned_embedder, tokenizer, data, ["title"], bench, seed=0)
    assert out["weights"]["click"] < 0.5, f"BM25 separates clicks, the embedder does not: {out['weights']}"
    assert out["weights"]["xling"] > 0.0, "only the embedder retrieves translations"
    assert out["scores"]["xling"].mean() == 1.0 and len(out["scores"]["click"]) == len(data.clicks_eval)
    clicks, pairs = held_in_sample(data, bench, 0)
    assert set(map(id, clicks)) <= set(map(id, data.clicks_train)) and len(clicks) == 32
    assert sorted(p.source for p in pairs) == sorted(p.source for p in data.parallel_train), "held-in only"
