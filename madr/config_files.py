"""Reading config files: the one reader of YAML / JSON mappings (experiment and stage configs, the stage table,
manifests) and the section of an experiment YAML a stage reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml


def read_config_file(path: str | Path | None, section: str | None = None) -> tuple[dict[str, Any], str]:
    """The mapping of a YAML config file ({} when `path` is None) and the dotted prefix its keys are named
    under in errors. With `section`, a file that has that top-level key gives its mapping (one experiment
    YAML holds every stage's section); a file without it is read whole (a stage's own YAML holds just its
    fields)."""
    if path is None:
        return {}, ""
    data = read_mapping(path)
    if section is None or section not in data:
        return data, ""
    if not isinstance(data[section], dict):
        raise ValueError(f"{path}: section {section!r} must be a mapping")
    return data[section], f"{section}."


def read_mapping(path: str | Path, fmt: str = "yaml") -> dict[str, Any]:
    """The top-level mapping of a YAML (`fmt` "yaml"; an empty file is {}) or JSON ("json") file. A missing
    file is a FileNotFoundError, text that does not parse or a top level that is not a mapping a ValueError;
    each names the file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist") from None
    try:
        data = json.loads(text) if fmt == "json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ValueError(f"{path}: not valid {fmt.upper()}: {err}") from None
    if data is None and fmt == "yaml":
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data
