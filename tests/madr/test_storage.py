"""madr.storage against a real S3 API server: push uploads what changed, pull verifies checksums, and a
push or pull killed part-way is completed by the next one."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from madr import storage


def tree(root, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def test_local_dir_of_uri_and_path(monkeypatch, tmp_path):
    monkeypatch.setenv("MADR_STAGING_DIR", str(tmp_path))
    assert storage.local_dir("s3://bucket/run/") == tmp_path / "s3" / "bucket" / "run"
    assert storage.local_dir("runs/demo") == Path("runs/demo") == storage.local_dir("file://runs/demo")


def test_push_then_pull_round_trip_uploads_only_changes(s3_bucket, tmp_path):
    uri = s3_bucket + "/run"
    src = tmp_path / "src"
    tree(src, {"data/a.parquet": b"a" * 1000, "index/manifest.json": b"{}", "_stages/x.done.json": b"{}"})
    assert storage.push(src, uri) == {"uploaded": 2, "unchanged": 0}, "markers under _stages are not synced"
    (src / "index" / "manifest.json").write_text('{"v": 2}')
    assert storage.push(src, uri) == {"uploaded": 1, "unchanged": 1}

    dst = tmp_path / "dst"
    assert storage.pull(uri, dst) == {"downloaded": 2, "unchanged": 0}
    assert json.loads((dst / "index" / "manifest.json").read_text()) == {"v": 2}
    assert storage.pull(uri, dst) == {"downloaded": 0, "unchanged": 2}
    assert storage.pull(uri, tmp_path / "only", under=("index",)) == {"downloaded": 1, "unchanged": 0}


def test_pull_refuses_a_file_whose_checksum_differs_from_the_record(s3_bucket, tmp_path):
    uri = s3_bucket + "/run"
    tree(tmp_path / "src", {"index/shard0.faiss": b"good"})
    storage.push(tmp_path / "src", uri)
    fs, root = storage.filesystem(uri)
    with fs.open_output_stream(root + "/index/shard0.faiss") as f:  # overwritten behind the record's back
        f.write(b"bad!")
    with pytest.raises(ValueError, match="index/shard0.faiss: sha256 .* does not match the record"):
        storage.pull(uri, tmp_path / "dst")
    assert not (tmp_path / "dst" / "index" / "shard0.faiss").exists()


def test_a_push_killed_before_its_record_is_redone_by_the_next(s3_bucket, tmp_path):
    uri = s3_bucket + "/run"
    src = tmp_path / "src"
    tree(src, {"a.bin": b"1", "b.bin": b"2"})
    storage.push(src, uri)
    (src / "b.bin").write_bytes(b"3")
    fs, root = storage.filesystem(uri)
    pafs.copy_files(str(src / "b.bin"), root + "/b.bin", destination_filesystem=fs)  # uploaded, then killed
    with pytest.raises(ValueError, match="does not match the record"):  # the old record still rules
        storage.pull(uri, tmp_path / "dst")
    assert storage.push(src, uri)["uploaded"] == 1
    assert storage.pull(uri, tmp_path / "dst") == {"downloaded": 1, "unchanged": 1}  # a.bin came the first time
