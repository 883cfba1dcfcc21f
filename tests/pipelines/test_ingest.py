"""Read + validate + tokenise in one pass (`read_tokenized`, tasks and actor pool), object-store style
paths (file:// URIs, a pyarrow SubTreeFileSystem), the tokenizer shipped to workers without
`transformers`, and the CLI with its progress output."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from madr.data.quarantine import read_quarantine, read_summary
from pipelines.data import cli
from pipelines.data.readers import ingest, read_source, read_tokenized
from pipelines.data.sources import get_source
from pipelines.data.tokenize import SharedEncoder, encoder_from_state, tokenize_table

LABELS = ("entailment", "neutral", "contradiction")


def snli_lines(n: int) -> tuple[list[str], set[int], list[dict]]:
    """n JSONL lines (1-based line i), the bad line numbers, and the good rows (normalised) in order."""
    lines, bad, good = [], set(), []
    for i in range(1, n + 1):
        premise = "a man " + " ".join(["plays"] * (i % 9)) + f" {i}"
        row = {"sentence1": premise, "sentence2": f"someone plays {i % 5}", "gold_label": LABELS[i % 3]}
        if i % 41 == 0:
            lines.append('{"sentence1": "broken')
            bad.add(i)
            continue
        if i % 53 == 0:
            row["gold_label"] = "perhaps"
            bad.add(i)
        else:
            good.append({"premise": row["sentence1"], "hypothesis": row["sentence2"], "label": row["gold_label"],
                         "language": "en"})
        lines.append(json.dumps(row))
    return lines, bad, good


@pytest.fixture(scope="module")
def tok_dir(tokenizer, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ingest_tok")
    tokenizer.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def ray_data(ray_local):
    ray_local.data.DataContext.get_current().enable_progress_bars = False
    return ray_local


def ids_of(table: pa.Table) -> list[tuple]:
    """Rows as hashable tuples (for order-free comparison)."""
    cols = [table.column(c).to_pylist() for c in table.column_names]
    return sorted(tuple(tuple(v) if isinstance(v, list) else v for v in row) for row in zip(*cols, strict=True))


def test_shared_encoder_gives_the_transformers_ids(tokenizer, tok_dir, ray_data):
    texts = ["A red shoe for men", "blue running shoes " * 20, "hat", "Ünïcödé and 中文 text"]
    expected = tokenizer(texts, truncation=True, max_length=12)["input_ids"]
    shared = SharedEncoder(tok_dir, max_length=12)
    assert shared.get()(texts) == expected, "the worker-side encoder must give the tokenizer's own ids"
    assert shared.get() is shared.get(), "built once per process"
    in_process = SharedEncoder(tokenizer, max_length=12)  # Ray is up: the backend went to the object store
    assert not isinstance(in_process._state, str) and in_process.get()(texts) == expected
    state = ray_data.get(in_process._state)
    assert encoder_from_state(state)(texts) == expected, "a plain process rebuilds it from the JSON alone"
    with pytest.raises(ValueError, match="max_length"):
        SharedEncoder(tok_dir, max_length=1)


@pytest.mark.parametrize("compute", ["tasks", "actors"])
def test_read_tokenized_equals_validate_then_tokenize(compute, tokenizer, tok_dir, ray_data, tmp_path):
    lines, bad, good = snli_lines(700)
    path = tmp_path / "snli_train.jsonl"
    path.write_text("\n".join(lines) + "\n")
    qdir = tmp_path / "q"
    ds = read_tokenized("snli", str(path), tok_dir, quarantine_dir=str(qdir), max_length=16, compute=compute,
                        workers=2, rows_per_block=64, split_bytes=12_000, bucket=True)
    got = pa.concat_tables(ds.iter_batches(batch_size=None, batch_format="pyarrow"))
    expected = tokenize_table(pa.Table.from_pylist(good, schema=get_source("snli").schema), tokenizer, "nli",
                              max_length=16)
    assert got.schema.names == ["premise_input_ids", "hypothesis_input_ids", "label_id"], got.schema
    assert got.num_rows == len(good) and ids_of(got) == ids_of(expected), "every good row once, same token ids"
    summary = read_summary(str(qdir), "snli")
    assert (summary.rows, summary.good, summary.num_quarantined, summary.balanced) == (700, len(good), len(bad), True)
    assert {r["row"] for r in read_quarantine(str(qdir)).to_pylist()} == bad, "bad rows with their line numbers"
    if compute == "tasks":  # bucketing: within each 64-row window the rows come sorted by length
        for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            lengths = np.diff(batch.column("premise_input_ids").combine_chunks().offsets.to_numpy())
            assert (np.diff(lengths[: min(len(lengths), 40)]) >= 0).any()
    with pytest.raises(ValueError, match="not tokenised"):
        read_tokenized("esci_judgments", str(path), tok_dir, quarantine_dir=str(qdir))


def test_object_store_style_paths(ray_data, tmp_path):
    """A file:// URI (inputs and quarantine) and a SubTreeFileSystem standing in for a bucket."""
    lines, bad, good = snli_lines(120)
    data = tmp_path / "bucket" / "nli" / "snli_dev.jsonl"
    data.parent.mkdir(parents=True)
    data.write_text("\n".join(lines) + "\n")
    uri = data.as_uri()
    assert uri.startswith("file:///")
    qdir = (tmp_path / "q_uri").as_uri()
    rows = read_source("snli", uri, quarantine_dir=qdir, rows_per_block=50).take_all()
    assert sorted(r["premise"] for r in rows) == sorted(g["premise"] for g in good)
    quarantined = read_quarantine(qdir).to_pylist()
    assert {q["file"] for q in quarantined} == {uri}, "origins name the URI as given"
    assert {q["row"] for q in quarantined} == bad and read_summary(qdir).balanced

    bucket = pafs.SubTreeFileSystem(str(tmp_path / "bucket"), pafs.LocalFileSystem())
    summary = ingest("snli", "nli", "out/snli", filesystem=bucket, rows_per_block=50)
    assert (summary.rows, summary.good, summary.num_quarantined) == (120, len(good), len(bad))
    written = pq.read_table(tmp_path / "bucket" / "out" / "snli")  # everything stayed inside the subtree
    assert written.num_rows == len(good)
    assert (tmp_path / "bucket" / "out" / "snli.quarantine" / "summary.json").is_file()
    assert {q["file"] for q in read_quarantine("out/snli.quarantine", bucket).to_pylist()} == {"nli/snli_dev.jsonl"}


def test_cli_ingest_tokenize_and_mix(ray_data, tok_dir, tmp_path, capsys):
    lines, bad, good = snli_lines(90)
    path = tmp_path / "snli.jsonl"
    path.write_text("\n".join(lines) + "\n")
    context = ray_data.data.DataContext.get_current()
    try:
        assert cli.main(["ingest", "--source", "snli", "--input", str(path), "--output", str(tmp_path / "norm")]) == 0
        out = capsys.readouterr().out
        assert f"90 rows read, {len(good)} good, 0 skipped, {len(bad)} quarantined" in out, out
        assert cli.main(["ingest", "--source", "snli", "--input", str(path), "--output", str(tmp_path / "tok"),
                         "--tokenizer", str(tok_dir), "--max-length", "16", "--bucket"]) == 0
        capsys.readouterr()
        assert pq.read_table(tmp_path / "tok").num_rows == len(good)
        assert cli.main(["mix", "--input", f"nli={tmp_path / 'tok'}", "--batch-size", "16", "--steps", "3"]) == 0
        out = capsys.readouterr().out
        assert f"sizes {{'nli': {len(good)}}}" in out and "step 2: nli (16 rows)" in out, out
        bad_line = tmp_path / "strict.jsonl"
        bad_line.write_text(lines[0] + "\n" + '{"sentence1": 3, "sentence2": "x", "gold_label": "neutral"}\n')
        assert cli.main(["ingest", "--source", "snli", "--input", str(bad_line), "--output", str(tmp_path / "s"),
                         "--strict"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "strict.jsonl: line 2: field 'sentence1': wrong_type" in err, err
        assert "Traceback" not in err, "the message, not Ray's remote traceback"
    finally:
        context.enable_progress_bars = False
