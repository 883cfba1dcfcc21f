"""Where the benchmarks read and write, the one way a quality benchmark reads its YAML config with
`--set key=value` overrides (a bad override is a clean exit naming it, not a traceback), its command-line
options, and its loop over training seeds (`over_seeds`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from madr.config_files import read_mapping
from madr.config_overrides import apply_overrides, parse_overrides

ROOT = Path(__file__).resolve().parents[2]  # the repository root
BENCHMARKS = ROOT / "benchmarks"  # results/ (JSON), plots/ (PNG) and data/ live under it
RUN_OUT = ROOT / "runs" / "benchmarks"  # where a run writes unless asked (--out-dir benchmarks publishes into the repo)
RESULTS = BENCHMARKS / "results"
PLOTS = BENCHMARKS / "plots"


def read_config(path: str | Path, sets: Sequence[str]) -> dict[str, Any]:
    """The YAML mapping at `path` with the `--set` overrides applied (SystemExit on a bad override)."""
    data = read_mapping(path)
    try:
        return apply_overrides(data, parse_overrides(sets))
    except ValueError as err:
        raise SystemExit(str(err)) from None


def repo_path(path: str | Path) -> str:
    """`path` against the repository root when relative (resolved), else as given."""
    return str(path) if Path(path).is_absolute() else str((ROOT / path).resolve())


def local_backbone(name: str | None) -> str | None:
    """A backbone name that is a relative path existing under the repository root -> that absolute path; a
    hub name, a `pypi:` package, an absolute path or None unchanged."""
    if name and not name.startswith("pypi:") and not Path(name).is_absolute() and (ROOT / name).exists():
        return str(ROOT / name)
    return name


def over_seeds(seeds: Sequence[int], run_seed: Callable[[int], tuple[Any, ...]],
               test_rows: Callable[[tuple[Any, ...]], Mapping[str, Mapping[str, float]]],
               metric: str = "mrr@5") -> list[list[Any]]:
    """`run_seed(seed)` for every seed, printing each seed's test `metric` per row (`test_rows(result)`: row ->
    metrics) as it finishes; the results transposed: one list per item of `run_seed`'s tuple, in seed order."""
    columns: list[list[Any]] = []
    for seed in seeds:
        result = run_seed(seed)
        columns = columns or [[] for _ in result]
        for column, value in zip(columns, result, strict=True):
            column.append(value)
        print(f"seed {seed} test {metric.upper()}: " + ", ".join(
            f"{k} {v[metric]:.3f}" for k, v in test_rows(result).items()), flush=True)
    return columns


def add_run_args(parser: argparse.ArgumentParser, config: Path, tag: str, seeds: list[int] | None = None) -> None:
    """The options every quality benchmark with a YAML config takes: --config (default `config`), --set
    (repeatable dotted override), --seeds (default `seeds`, None: the config's), --threads, --tag (`tag`)."""
    parser.add_argument("--config", default=str(config))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="dotted config override, e.g. finetune.steps=20 (repeatable)")
    shown = "the config's" if seeds is None else " ".join(map(str, seeds))
    parser.add_argument("--seeds", type=int, nargs="+", default=seeds, help=f"training seeds (default: {shown})")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--tag", default=tag, help="name of the JSON / PNG")
