"""The ESCI text samples as a catalog (madr.data.sources.esci) and the wiring of benchmarks.quality.esci_transfer: tiny
rows trained on a synthetic catalog, saved, then evaluated on a hand-made ESCI sample (quality is the script's job)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from benchmarks.quality import esci_transfer as bench
from madr.data.sources.esci import TEXT_SAMPLES, esci_text_catalog


def _esci_dir(tmp_path: Path, title: str = "Acme Blue Garden Hose 50 ft") -> Path:
    rows = [("garden hose", "A1", "us", title, "Acme", "Blue"),
            ("garden hose", "A2", "us", "Flexi Garden Hose Green 25 ft", "Flexi", "Green"),
            ("led bulb", "B1", "us", "Brite LED Bulb 60W Soft White", "Brite", "Soft White"),
            ("led bulb", "B2", "us", "Lumo LED Light Bulb Daylight", "Lumo", ""),
            ("door lock", "C1", "us", "Safe Door Lock Satin Nickel", "Safe", "Satin Nickel"),
            ("door lock", "C2", "us", "Guard Keyless Door Lock Black", "Guard", "Black"),
            ("vitamina c", "E1", "es", "Vitamina C 1000 mg", "Salud", "")]
    names = ("query", "product_id", "product_locale", "product_title", "product_brand", "product_color")
    out = tmp_path / "esci"
    out.mkdir(exist_ok=True)
    pq.write_table(pa.table({n: [r[i] for r in rows[:4]] for i, n in enumerate(names)}), out / TEXT_SAMPLES[0])
    pq.write_table(pa.table({n: [r[i] for r in rows[4:]] for i, n in enumerate(names)}), out / TEXT_SAMPLES[1])
    return out


def test_the_real_samples_make_a_test_only_catalog_of_exact_judgments(shared_data: Path) -> None:
    us = esci_text_catalog(shared_data / "esci")
    assert (len(us.products), len(us.queries), len(us.judgments)) == (530, 54, 530)
    assert {q.split for q in us.queries} == {"test"} and {(j.relevance, j.esci) for j in us.judgments} == {(4, "E")}
    assert us.products[0].aspects == {"brand": ["yaheetech"], "color": ["grey"]}
    both = esci_text_catalog(shared_data / "esci", locales=("us", "es"))
    assert (len(both.products), len(both.queries)) == (585, 56)


def test_locale_filter_and_an_empty_title_names_file_row_and_field(tmp_path: Path) -> None:
    catalog = esci_text_catalog(_esci_dir(tmp_path))
    assert [q.text for q in catalog.queries] == ["garden hose", "led bulb", "door lock"]
    assert len(catalog.products) == 6 and catalog.products[3].aspects == {"brand": ["lumo"], "color": []}
    with pytest.raises(ValueError, match=r"esci_sample_with_product_text_grandi9.parquet: row 0: field 'product_title'"):
        esci_text_catalog(_esci_dir(tmp_path, title=" "))


def test_rows_are_trained_once_saved_and_evaluated_on_esci(tiny_aspects_config: Path, tmp_path: Path, capsys) -> None:
    args = ["--config", str(tiny_aspects_config), "--esci-dir", str(_esci_dir(tmp_path)), "--threads", "1",
            "--out-dir", str(tmp_path / "out"), "--seeds", "0", "1", "--set", "bench.corpus_size=150",
            "--models", "bm25", "zero_shot", "bibert", "madral_pw", "mural"]
    threads = torch.get_num_threads()
    try:
        first = bench.main(args)
        trained = capsys.readouterr().out
        again = bench.main([*args, "--tag", "again"])
        reused = capsys.readouterr().out
    finally:
        torch.set_num_threads(threads)
    assert trained.count("training it as the Home Depot table does") == 6, "3 rows x 2 seeds"
    assert "training it" not in reused and again["mean"] == first["mean"], "the saved models are evaluated again"
    assert all((tmp_path / "run" / f"seed{s}" / k / "model").is_dir() for s in (0, 1) for k in ("bibert", "mural"))
    saved = json.loads((tmp_path / "out" / "results" / "esci_transfer.json").read_text())
    assert (tmp_path / "out" / "plots" / "esci_transfer.png").is_file()
    assert saved["data"]["queries"] == 3 and saved["data"]["products"] == 6
    for key in ("bm25", "zero_shot", "bibert", "madral_pw", "mural"):
        assert list(saved["mean"][key]) == bench.METRICS
        assert all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in saved["mean"][key].values()), saved["mean"][key]
    assert saved["std"]["bm25"]["recall@10"] == 0.0 and set(saved["per_seed"]) == {"0", "1"}
    assert set(saved["tests"]["vs_baseline"]) == {"bm25", "zero_shot", "madral_pw", "mural"}
    assert set(saved["tests"]["vs_madral"]) == {"mural"} and "paper 001 Table 3 shape" in saved["table"]
    brand = saved["data"]["annotator_vs_esci_fields"]["brand"]
    assert brand["n"] == 6 and 0.0 <= brand["accuracy"] <= 1.0
