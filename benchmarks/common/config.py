"""The repository paths, the benchmarks' argument parser, a quality benchmark's YAML config with `--set key=value`
overrides, and writing a result: its JSON, and its plots (matplotlib on the file-only Agg backend, optional:
without it a benchmark still writes its JSON)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from madr.config_files import read_mapping
from madr.config_overrides import apply_overrides, parse_overrides

ROOT = Path(__file__).resolve().parents[2]  # the repository root
BENCHMARKS = ROOT / "benchmarks"  # results/ (JSON), plots/ (PNG) and data/ live under it
RUN_OUT = ROOT / "runs" / "benchmarks"  # where a run writes unless asked (--out-dir benchmarks publishes into the repo)
RESULTS = BENCHMARKS / "results"
PLOTS = BENCHMARKS / "plots"


def parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of `python -m <module>`, its docstring as the description."""
    return argparse.ArgumentParser(prog=f"python -m {module}", description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def read_config(path: str | Path, sets: Sequence[str]) -> dict[str, Any]:
    """The YAML mapping at `path` with the `--set` overrides applied (SystemExit on a bad override)."""
    try:
        return apply_overrides(read_mapping(path), parse_overrides(sets))
    except ValueError as err:
        raise SystemExit(str(err)) from None


def repo_path(path: str | Path) -> str:
    """`path` against the repository root when relative (resolved), else as given."""
    return str(path) if Path(path).is_absolute() else str((ROOT / path).resolve())


def local_backbone(name: str | None) -> str | None:
    """A relative backbone path that exists under the repository root -> absolute; anything else unchanged."""
    if name and not name.startswith("pypi:") and not Path(name).is_absolute() and (ROOT / name).exists():
        return str(ROOT / name)
    return name


def add_run_args(parser: argparse.ArgumentParser, config: Path, tag: str) -> None:
    """--config (default `config`), --set (repeatable), --seeds (default: the config's), --threads, --tag."""
    parser.add_argument("--config", default=str(config))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="dotted config override, e.g. finetune.steps=20 (repeatable)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="training seeds (default: the config's)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--tag", default=tag, help="name of the JSON / PNG")


def write_json(path: str | Path, result: Any, indent: int = 1) -> Path:
    """`result` as JSON at `path` (folders created; numpy scalars as floats); the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=indent, default=float))
    return path


def write_result_json(out_dir: str | Path, tag: str, result: dict[str, Any]) -> Path:
    """`result` at `<out_dir>/results/<tag>.json`."""
    return write_json(Path(out_dir) / "results" / f"{tag}.json", result)


def pyplot() -> Any | None:
    """`matplotlib.pyplot` on Agg, or None (saying so) when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no plot")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path, dpi: int = 120) -> Path:
    import matplotlib.pyplot as plt

    path = Path(path)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
