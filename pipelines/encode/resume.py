"""A job's identity and resumption: what must not change between a run and its resumption (``job.json``),
starting over or resuming in an output directory, and cleaning what a crashed run left behind."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from madr.encode_config import EncodeConfig
from madr.index.manifest import atomic_write_text
from pipelines.encode.corpus import CorpusPlan
from pipelines.encode.shards import DOCS_DIR
from pipelines.encode.stages import PARTS_DIR

JOB_FILE = "job.json"


@dataclass
class ModelInfo:
    dim: int
    hybrid: bool
    hybrid_lambda: float
    vocab_size: int
    fingerprint: str


def model_info(model_dir: str) -> ModelInfo:
    """Dimension, kind and a fingerprint (the contents of every file) of a saved model.

    Contents, not sizes: a retrained model has the same file sizes, and its index must not resume from
    shards the previous weights encoded. Read from the model's files (``model_shape``) without importing torch
    or building the model (which would slow the job's start-up on the driver); the encode actors check these
    values against the model they load."""
    path = Path(model_dir)
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f"{f.relative_to(path)}:".encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    dim, hybrid, lam, vocab = model_shape(path)
    return ModelInfo(dim, hybrid, lam, vocab, h.hexdigest()[:16])


def model_aspects(model_dir: str) -> tuple[dict[str, list[str]], bool] | None:
    """({aspect: phrase value strings}, calibrated) of a saved model that predicts aspect values (aspect learning
    and its vocabularies), read from its files without torch; None for a model without aspect heads."""
    from madr.config import ModelConfig, from_dict
    from madr.modeling.aspect_vocabulary import AspectVocabularies
    from madr.modeling.calibration import CALIBRATION_FILE

    path = Path(model_dir)
    cfg = from_dict(ModelConfig, json.loads((path / "config.json").read_text()))
    vocab_file = path / "aspect_vocabularies.json"
    if not cfg.learns_aspects or not cfg.aspects or not vocab_file.is_file():
        return None
    if cfg.uses_granularities and "phrase" not in cfg.granularities:
        return None  # the stored distributions are over phrase values
    vocab = AspectVocabularies.load(vocab_file)
    return {a: list(vocab.get(a, "phrase").values) for a in cfg.aspects}, (path / CALIBRATION_FILE).is_file()


def model_shape(path: Path) -> tuple[int, bool, float, int]:
    """(embedding dim, has_sparse, hybrid_lambda, tokenizer length) of the saved model at `path`: from its
    ``config.json``, the backbone's ``config.json`` (hidden size) and ``tokenizer/tokenizer.json`` (pieces with
    the added tokens, what ``len(tokenizer)`` counts); a model without those files (DSSM, a bare vocab.txt)
    is loaded instead."""
    from madr.config import ModelConfig, from_dict

    config = path / "config.json"
    if not config.is_file():
        raise ValueError(f"{path}: not a madr model directory (no config.json)")
    cfg = from_dict(ModelConfig, json.loads(config.read_text()))
    backbone, tokenizer = path / "query_backbone" / "config.json", path / "tokenizer" / "tokenizer.json"
    if (cfg.projection_dim or backbone.is_file()) and tokenizer.is_file():
        from tokenizers import Tokenizer

        dim = cfg.projection_dim or int(json.loads(backbone.read_text())["hidden_size"])
        vocab = Tokenizer.from_file(str(tokenizer)).get_vocab_size(with_added_tokens=True)
        return int(dim), cfg.has_sparse, cfg.hybrid_lambda, int(vocab)
    from madr.modeling.model import BiEncoder

    model = BiEncoder.load(path)
    return model.embedding_dim, cfg.has_sparse, cfg.hybrid_lambda, len(model.tokenizer)


def lexical_tokenizer_fingerprint(tokenizer: Any) -> str:
    """A fingerprint of the files ``save_pretrained`` writes for ``tokenizer`` (what the job saves in the index)."""
    import tempfile

    from madr.index.lexical import save_tokenizer

    with tempfile.TemporaryDirectory(prefix="madr_lextok_") as tmp:
        files = save_tokenizer(tokenizer, Path(tmp) / "tok")
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]


def job_identity(cfg: EncodeConfig, plan: CorpusPlan, info: ModelInfo,
                 lexical_tokenizer: str | None = None, aspect_top_k: int = 0) -> dict[str, Any]:
    """What must not change between a run and its resumption (performance knobs may); ``lexical_tokenizer``:
    the fingerprint of the lexical part's own tokenizer (``lexical_tokenizer_fingerprint``)."""
    keys = ("id_column", "text_columns", "docs_columns", "store_docs", "index_factory", "train_size", "seed",
            "max_length")
    ident = {k: getattr(cfg, k) for k in keys}
    if cfg.lexical is not None:  # only when set: jobs written before the option keep their identity
        ident["lexical"] = cfg.lexical
    if lexical_tokenizer is not None:  # likewise: only for indexes with a tokenizer of their own
        ident["lexical_tokenizer"] = lexical_tokenizer
    if cfg.sparse_backend is not None:  # likewise: the shards' files depend on it
        ident["sparse_backend"] = cfg.sparse_backend
    if aspect_top_k:  # likewise: only for indexes that store aspect values
        ident["aspect_top_k"] = aspect_top_k
    if cfg.dtype == "int8":  # likewise: int8 weights give other vectors (a float dtype only rounds the same ones)
        ident["dtype"] = cfg.dtype
    ident.update(model=info.fingerprint, plan=plan.fingerprint(), num_shards=plan.num_shards)
    ident["hash"] = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    return ident


def start_or_resume(out: Path, ident: dict[str, Any], overwrite: bool, replace_other_job: bool = False) -> None:
    """Resume the job in ``out`` when it has the same identity; start over with ``overwrite``, or when it
    holds another job and ``replace_other_job`` (the pipeline's setting: it owns the directory)."""
    path = out / JOB_FILE
    if not overwrite and path.is_file():
        old = json.loads(path.read_text()).get("identity", {})
        if old.get("hash") == ident["hash"]:
            return
        diff = sorted(k for k in set(old) | set(ident) if old.get(k) != ident.get(k) and k != "hash")
        if not replace_other_job:
            raise ValueError(f"{out} holds another encode job (differs in {diff}); use a new output or overwrite")
        overwrite = True
    if overwrite:
        for item in out.iterdir():
            shutil.rmtree(item) if item.is_dir() else item.unlink()
    elif any(out.iterdir()):
        raise ValueError(f"{out} is not empty and holds no encode job ({JOB_FILE}); use a new output or overwrite")
    atomic_write_text(path, json.dumps({"identity": ident}, indent=1))


def job_identity_hash(out: Path) -> str | None:
    path = out / JOB_FILE
    return json.loads(path.read_text())["identity"]["hash"] if path.is_file() else None


def clean_stale_parts(out: Path, run: str) -> None:
    """Remove what a crashed run can leave behind: part files of other runs, and temporary files of
    ``atomic_write`` (``.<name>.<random>.tmp``) that were never renamed."""
    root = out / PARTS_DIR
    if root.is_dir():
        for d in root.iterdir():
            if d.name != run:
                shutil.rmtree(d, ignore_errors=True)
    for folder in (out, out / DOCS_DIR):
        for tmp in folder.glob(".*.tmp") if folder.is_dir() else []:
            tmp.unlink(missing_ok=True)
        for tmp in folder.glob(".*.tmpdir") if folder.is_dir() else []:  # madr.index.lexical.save_tokenizer's
            shutil.rmtree(tmp, ignore_errors=True)
