"""Dotted-key overrides of a config: `--set key.sub=value` pairs parsed into {dotted key: value}
(`parse_overrides`, `parse_value`) and set into a loaded YAML mapping (`apply_overrides`) before
`madr.config.from_dict` turns it into dataclasses."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import yaml


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`data` with every dotted key of `overrides` set (in place; missing mappings are created)."""
    for key, value in overrides.items():
        node = data
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {key!r}: {p!r} is not a mapping in the config")
        node[leaf] = value
    return data


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """`--set key.sub=value` pairs -> {dotted key: value} (values by `parse_value`), for `apply_overrides`."""
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"--set expects key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        out[key.strip()] = parse_value(value)
    return out


def parse_value(text: str) -> Any:
    """A `--set key=value` value: YAML scalars and lists, plus the floats YAML 1.1 reads as strings (5e-4)."""
    value = yaml.safe_load(text)
    if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
        return float(value)
    return value


_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
