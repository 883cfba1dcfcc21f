"""Real multilingual sources (madr.data.sources.real_multilingual): rows, labels, held-out splits, bad-row errors."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from madr.data.sources.real_multilingual import (
    RealMultilingualConfig,
    click_layout,
    load_real_multilingual,
    read_click_pairs,
    read_snli,
    read_tatoeba,
    read_xnli,
    split_keys,
)

LANGS = ["deu", "fra", "rus"]


@pytest.fixture(scope="module")
def real(shared_data: Path):
    cfg = RealMultilingualConfig(data_dir=str(shared_data), parallel_languages=LANGS,
                                 parallel_train_per_language=300, parallel_eval_per_language=100)
    return load_real_multilingual(cfg)


def test_click_pairs_are_read_with_labels_and_fields(shared_data: Path) -> None:
    rows = read_click_pairs(shared_data / "query_relevance/xglue_qadsm_de_dev.parquet")
    assert len(rows) == 1000 and Counter(r.clicked for r in rows) == {False: 514, True: 486}
    first = rows[0]
    assert first.query == "pritt glue stick" and first.clicked and first.relevance == 1
    assert first.fields["title"].startswith("Pritt Glue bei Amazon.de")
    assert first.fields["description"] == "Kostenlose Lieferung möglich"
    assert first.query_id == "q:pritt glue stick" and first.language == "de"
    qam = read_click_pairs(shared_data / "query_relevance/xglue_qam_de_dev.parquet")
    assert len(qam) == 1000 and sum(r.clicked for r in qam) == 514 and set(qam[0].fields) == {"passage"}


def test_nli_and_parallel_readers(shared_data: Path) -> None:
    xnli = read_xnli(shared_data / "nli/xglue_xnli_de_train.parquet")
    assert len(xnli) == 2245 and Counter(r.label for r in xnli)["neutral"] == 761
    assert {r.language for r in xnli} == {"de"}
    snli, skipped = read_snli(shared_data / "nli/snli_dev_subset.parquet")
    assert (len(snli), skipped) == (1273, 16) and {r.language for r in snli} == {"en"}
    pairs = read_tatoeba(shared_data / "parallel/tatoeba_parallel_dev.parquet", LANGS)
    assert Counter(r.source_lang for r in pairs) == {"deu": 700, "fra": 700, "rus": 700}
    assert all(r.target_lang == "eng" and r.target for r in pairs)


def test_held_out_sets_never_share_their_key_with_training(real) -> None:
    s = real.summary
    assert not {r.query_id for r in real.clicks_train} & {r.query_id for r in real.clicks_eval}
    assert s["click_train_dropped_eval_query"] == 3087 and s["click_eval_queries"] == 813
    assert not {r.premise for r in real.nli_train} & {r.premise for r in real.nli_eval}
    assert {r.language for r in real.nli_eval} == {"de", "en"}
    assert s["snli_train_rows"] + s["snli_eval_rows"] == 1273
    assert not {r.target for r in real.parallel_train} & {r.target for r in real.parallel_eval}
    per_lang = Counter(r.source_lang for r in real.parallel_eval)
    assert set(per_lang) == set(LANGS) and max(per_lang.values()) <= 100
    assert max(Counter(r.source_lang for r in real.parallel_train).values()) <= 300


def test_split_is_seeded_and_sized() -> None:
    keys = [f"k{i}" for i in range(100)] * 2
    held = split_keys(keys, 0.3, seed=1)
    assert len(held) == 30 and held == split_keys(keys, 0.3, seed=1) and held != split_keys(keys, 0.3, seed=2)
    with pytest.raises(ValueError, match="eval_fraction"):
        split_keys(keys, 1.0, seed=0)


def _write(path: Path, columns: dict[str, list]) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def test_bad_rows_name_file_row_and_field(tmp_path: Path) -> None:
    bad_label = _write(tmp_path / "ads.parquet", {"query": ["a", "b"], "ad_title": ["t", "u"],
                                                  "ad_description": ["", "d"], "label": ["Good", "Meh"]})
    with pytest.raises(ValueError, match=r"ads\.parquet: row 1: field 'label' is 'Meh'"):
        read_click_pairs(bad_label)
    empty_query = _write(tmp_path / "qam.parquet", {"question": ["q", "  "], "passage": ["p", "p"],
                                                    "label": ["1", "0"]})
    assert click_layout(empty_query) == "qam"
    with pytest.raises(ValueError, match=r"qam\.parquet: row 1: field 'question' is empty"):
        read_click_pairs(empty_query)
    unknown = _write(tmp_path / "other.parquet", {"q": ["a"], "d": ["b"]})
    with pytest.raises(ValueError, match=r"other\.parquet: neither the QADSM columns"):
        read_click_pairs(unknown)
    nli = _write(tmp_path / "xnli.parquet", {"premise": ["p", "p"], "hypothesis": ["h", "h"],
                                             "label": ["2", "maybe"]})
    with pytest.raises(ValueError, match=r"xnli\.parquet: row 1: field 'label' is 'maybe'"):
        read_xnli(nli)
    snli = _write(tmp_path / "snli.parquet", {"sentence1": ["p", "p"], "sentence2": ["h", None],
                                              "gold_label": ["-", "neutral"]})
    with pytest.raises(ValueError, match=r"snli\.parquet: row 1: field 'sentence2' is empty"):
        read_snli(snli)
    tatoeba = _write(tmp_path / "tat.parquet", {"lang": ["deu"], "text": ["Hallo"], "text_eng": ["Hello"]})
    with pytest.raises(ValueError, match=r"tat\.parquet: no rows for language\(s\) \['fra'\]"):
        read_tatoeba(tatoeba, ["deu", "fra"])
    with pytest.raises(ValueError, match=r"tat\.parquet: missing column\(s\) \['premise', 'hypothesis', 'label'\]"):
        read_xnli(tatoeba)
    with pytest.raises(FileNotFoundError, match="absent.parquet"):
        read_xnli(tmp_path / "absent.parquet")


def test_hf_integer_nli_labels_and_config_checks(tmp_path: Path) -> None:
    path = _write(tmp_path / "x.parquet", {"premise": ["p"] * 3, "hypothesis": ["a", "b", "c"],
                                           "label": ["0", "1", "2"]})
    assert [r.label for r in read_xnli(path, "fr")] == ["entailment", "neutral", "contradiction"]
    with pytest.raises(ValueError, match="real_data.parallel_eval_fraction"):
        RealMultilingualConfig(parallel_eval_fraction=0.0)
    with pytest.raises(ValueError, match="real_data.parallel_train_per_language"):
        RealMultilingualConfig(parallel_train_per_language=0)


def test_real_config_parses_and_null_projection_is_allowed() -> None:
    import yaml

    from madr.config import from_dict
    from madr.recipes.multitask.config import EncoderConfig, MultiTaskExperimentConfig

    data = yaml.safe_load((Path(__file__).resolve().parents[3] / "configs/real/multitask.yaml").read_text())
    real = from_dict(RealMultilingualConfig, data.pop("real_data"))
    assert real.parallel_languages[0] == "deu" and real.split_seed == 0
    data.pop("bench")
    cfg = from_dict(MultiTaskExperimentConfig, data)
    assert cfg.model.projection_dim is None and cfg.tasks.baseline == ["click"]
    assert cfg.schedule.mode == "proportional"
    with pytest.raises(ValueError, match="projection_dim must be >= 1 or null"):
        EncoderConfig(projection_dim=0)


def test_several_click_files_and_every_tatoeba_language(shared_data: Path) -> None:
    """The sources of configs/real/multitask_e5.yaml: QADSM and QAM together (train and held-out), Tatoeba's
    every language (null)."""
    cfg = RealMultilingualConfig(
        data_dir=str(shared_data), parallel_languages=None, parallel_train_per_language=2, parallel_eval_per_language=1,
        click_train=["query_relevance/xglue_qadsm_de_train.parquet", "query_relevance/xglue_qam_de_train.parquet"],
        click_eval=["query_relevance/xglue_qadsm_de_dev.parquet", "query_relevance/xglue_qam_de_dev.parquet"])
    data = load_real_multilingual(cfg)
    assert data.summary["click_train_rows"] == 18000 and data.summary["click_eval_rows"] == 2000
    assert sum("passage" in r.fields for r in data.clicks_eval) == 1000, "the QAM half keeps its passage field"
    assert not {r.query_id for r in data.clicks_train} & {r.query_id for r in data.clicks_eval}
    assert len({r.source_lang for r in data.parallel_train}) == 112 == len({r.source_lang for r in data.parallel_eval})
    with pytest.raises(ValueError, match="click_train must name at least one file"):
        RealMultilingualConfig(click_train=[])
