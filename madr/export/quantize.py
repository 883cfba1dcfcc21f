"""Int8 towers: dynamic quantisation of a tower's Linear layers, in torch and in onnxruntime.

Dynamic (post-training) quantisation stores each Linear / MatMul weight matrix as int8 with a scale (and, in
onnxruntime, a zero point) and quantises each activation on the fly from its own range at run time, so the
matrix products run as int8 x int8 -> int32 and are rescaled to float (Jacob et al., "Quantization and Training of
Neural Networks for Efficient Integer-Arithmetic-Only Inference", CVPR 2018, Sec. 2; for BERT encoders: Zafrir
et al., "Q8BERT: Quantized 8Bit BERT", 2019, and the PyTorch "Dynamic Quantization on BERT" tutorial). No
calibration data and no training: the weights are rounded once. Embedding tables, LayerNorm, softmax and the
pooling stay in float, so only the transformer's dense layers change (for e5-small: the Q/K/V/output and
feed-forward matrices of every layer, ~18% of the weights; the 250k x 384 word table is most of the rest).

Weight scales are per output channel by default (`per_channel=True`: one scale per row of each weight matrix,
the same int8 kernels); `per_channel=False` takes one scale per matrix. On multilingual-e5-small per-channel
scales kept more of the fp32 quality at the same speed (x-ling top-1 98.0% vs 95.8% of fp32 in torch, 99.2% vs
97.7% in onnxruntime), so they are what `encoder_precision: int8` serves.

- `quantize_linear_int8(module)`: a copy of `module` whose `nn.Linear` layers are
  `torch.ao.quantization.quantize_dynamic` qint8 Linears; every other tensor is
  SHARED with `module` (no second copy of the word table), and `module` itself is left as it was. torch 2.13
  marks `torch.ao.quantization` deprecated in favour of `torchao` (not a dependency here); it still runs, and
  its notices are silenced where it is called.
- `int8_model(model)`: that copy of a whole `BiEncoder`, what the encode job's `encode.dtype: int8` encodes
  documents with.
- `Int8QueryEncoder`: a `madr.search.query_encoder.LeanQueryEncoder` whose tower is that copy: the same
  tokenisation, batching, outputs and sparse rows, int8 matrix products.
- `quantize_onnx_int8(src, dst)`: `onnxruntime.quantization.quantize_dynamic` of an ONNX tower
  (`madr.export.onnx.export_onnx`): MatMul weights as signed int8 (`QuantType.QInt8`), activations uint8
  (`MatMulInteger` / `DynamicQuantizeLinear`); run it with `madr.export.onnx.OnnxQueryEncoder`.
- `int8_encoder(model, backend, ...)`: the int8 encoder of either backend; `madr.serve_config.ServeSettings.
  encoder_precision: int8` builds its query encoder with it.
"""

from __future__ import annotations

import copy
import itertools
import platform
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from madr.modeling.model import BiEncoder
from madr.search.query_encoder import LeanQueryEncoder
from madr.serve_config import ENCODER_BACKENDS, ENCODER_PRECISIONS

ONNX_OPS = ("MatMul",)  # what the ONNX graph's Linear layers are; Gather (the word table) stays float


def check_precision(precision: str) -> str:
    """`precision` if it is one of `ENCODER_PRECISIONS`, else a ValueError naming them."""
    if precision not in ENCODER_PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(ENCODER_PRECISIONS)}, got {precision!r}")
    return precision


def shared_copy(module: nn.Module) -> nn.Module:
    """A copy of `module`'s module tree whose parameters and buffers are `module`'s own tensors (not copied)."""
    memo = {id(t): t for t in itertools.chain(module.parameters(), module.buffers())}
    return copy.deepcopy(module, memo)


def quantize_linear_int8(module: nn.Module, per_channel: bool = True) -> nn.Module:
    """A copy of `module` (eval mode) with every `nn.Linear` replaced by a dynamic qint8 Linear
    (`torch.ao.quantization.quantize_dynamic`); the other tensors are shared with `module`, which is unchanged.
    `per_channel`: one weight scale per output row (default) or one per matrix (module docstring)."""
    if torch.backends.quantized.engine == "none":
        raise RuntimeError("torch has no quantized engine on this machine (torch.backends.quantized.engine)")
    out = shared_copy(module).eval()
    with warnings.catch_warnings():  # torch.ao.quantization's deprecation notices (module docstring)
        warnings.filterwarnings("ignore", message=".*(deprecated|will be removed).*")
        q = torch.ao.quantization
        qconfig = q.per_channel_dynamic_qconfig if per_channel else q.default_dynamic_qconfig
        return q.quantize_dynamic(out, {nn.Linear: qconfig}, dtype=torch.qint8, inplace=True)


def count_int8_linears(module: nn.Module) -> int:
    """How many dynamic int8 Linear layers `module` holds (0: nothing was quantised)."""
    return sum(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in module.modules())


def int8_model(model: BiEncoder, per_channel: bool = True) -> BiEncoder:
    """An int8 copy of the whole `model` for encoding on the CPU (`quantize_linear_int8`; `model` is unchanged):
    what the encode job's `encode.dtype: int8` encodes documents with. ValueError when it holds no Linear."""
    if next(model.parameters()).device.type != "cpu":
        raise ValueError("int8 dynamic quantisation runs on the CPU; the model is not on it")
    out = quantize_linear_int8(model, per_channel)
    if count_int8_linears(out) == 0:
        raise ValueError(f"model {model.config.name!r} has no Linear layer to quantise")
    return out


class Int8QueryEncoder(LeanQueryEncoder):
    """`LeanQueryEncoder` over an int8 copy of `model`'s `side` tower (`quantize_linear_int8`); `model` stays
    float (and keeps serving /explain). The hybrid MLM projection onto the vocabulary stays float."""

    def __init__(
        self,
        model: BiEncoder,
        term_ids: Sequence[int] | np.ndarray | None = None,
        side: str = "query",
        batch_size: int = 64,
        per_channel: bool = True,
    ) -> None:
        super().__init__(model, term_ids, side, batch_size)
        if self.device.type != "cpu":
            raise ValueError(f"int8 dynamic quantisation runs on the CPU; the model is on {self.device}")
        self.tower = quantize_linear_int8(self.tower, per_channel)
        if count_int8_linears(self.tower) == 0:
            raise ValueError(f"model {model.config.name!r}: its {side} tower has no Linear layer to quantise")


def cpu_has_int8_dot() -> bool:
    """Whether this CPU multiplies u8 x s8 without int16 saturation: any non-x86 CPU (ARM's SDOT / UMMLA), or an
    x86 one with VNNI (`avx512_vnni`, `avx_vnni`) or AMX. Without them (AVX2, AVX-512 before Cascade Lake)
    onnxruntime's u8s8 kernels sum pairs of products in int16 (`vpmaddubsw`), which saturates for 8-bit weights."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return True
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:  # not Linux: assume the worst, which costs one bit of weight precision
        return False
    return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & set(flags))


def quantize_onnx_int8(
    src: str | Path, dst: str | Path, ops: Sequence[str] = ONNX_OPS, per_channel: bool = True,
    reduce_range: bool | None = None,
) -> Path:
    """Write `src` (an ONNX tower) with its `ops` weights dynamically quantised to int8 at `dst`
    (`onnxruntime.quantization.quantize_dynamic`, signed int8 weights, one scale per output column with
    `per_channel` (default), else one per matrix). `reduce_range`: 7-bit weights, which onnxruntime's u8s8
    kernels need on CPUs without VNNI (see `cpu_has_int8_dot`); None (default) decides by this CPU, so quantise
    on the CPU kind that serves. ValueError when no node was quantised (a graph whose weights are not
    initialisers of those ops)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    quantize_dynamic(
        str(src),
        str(dst),
        op_types_to_quantize=list(ops),
        weight_type=QuantType.QInt8,
        per_channel=per_channel,
        reduce_range=not cpu_has_int8_dot() if reduce_range is None else reduce_range,
    )
    kinds = {node.op_type for node in onnx.load(str(dst), load_external_data=False).graph.node}
    if not kinds & {"MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"}:
        raise ValueError(f"{src}: no {'/'.join(ops)} node was quantised")
    return dst


def onnx_int8_encoder(
    model: BiEncoder,
    side: str = "query",
    threads: int = 1,
    batch_size: int = 64,
    workdir: str | Path | None = None,
    per_channel: bool = True,
) -> LeanQueryEncoder:
    """`model`'s `side` tower exported (`export_onnx`), quantised (`quantize_onnx_int8`) and loaded in
    onnxruntime (`OnnxQueryEncoder`); the files go in `workdir` (None: a temporary directory, removed once the
    session holds the graph)."""
    import tempfile

    from madr.export.onnx import OnnxQueryEncoder, export_onnx

    if workdir is not None:
        fp32 = export_onnx(model, Path(workdir) / f"{side}.onnx", side)
        int8 = quantize_onnx_int8(fp32, Path(workdir) / f"{side}.int8.onnx", per_channel=per_channel)
        return OnnxQueryEncoder(model, int8, side, batch_size, threads)
    with tempfile.TemporaryDirectory(prefix="madr-int8-") as tmp:
        return onnx_int8_encoder(model, side, threads, batch_size, tmp, per_channel)


def int8_encoder(
    model: BiEncoder,
    backend: str = "torch",
    term_ids: Sequence[int] | np.ndarray | None = None,
    side: str = "query",
    threads: int = 1,
    batch_size: int = 64,
    per_channel: bool = True,
) -> LeanQueryEncoder:
    """The int8 `side` encoder of `model` in `backend` ("torch": `Int8QueryEncoder`; "onnx": `onnx_int8_encoder`,
    whole vocabulary only, so no `term_ids`); `per_channel`: a weight scale per output channel (default)."""
    if backend == "torch":
        return Int8QueryEncoder(model, term_ids, side, batch_size, per_channel)
    if backend != "onnx":
        raise ValueError(f"int8 encoder backend must be one of {', '.join(ENCODER_BACKENDS)}, got {backend!r}")
    if term_ids is not None:
        raise ValueError(
            "the ONNX int8 encoder projects onto the whole vocabulary (term_ids needs backend 'torch')"
        )
    return onnx_int8_encoder(model, side, threads, batch_size, per_channel=per_channel)
