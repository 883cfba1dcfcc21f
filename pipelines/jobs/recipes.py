"""Which recipe a run config is, and what the runner needs of it: its stage table, its config check, the stages it
leaves out and the Serve args of its index.

A config names its recipe with the top-level key `recipe:` (`product_search` when absent): `product_search`
(papers 000-003: `madr.config.ExperimentConfig`, stages of `pipelines.jobs.stages`) or `multilingual` (paper 004:
`pipelines.multitask.config.PipelineConfig`, stages of `pipelines.jobs.multilingual`). The runner, markers, keys,
plan and submission are the same for both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipelines.jobs import checks, multilingual
from pipelines.jobs.stages import STAGES, Stage

DEFAULT = "product_search"


@dataclass(frozen=True)
class Recipe:
    """A recipe as the runner sees it.

    `check(configs, paths, stages, here)`: every named stage's parsed config as the stage will load it (a
    ValueError naming the file and key). `not_applicable(stage, data, where)`: why the config leaves the stage out
    (None: it runs). `serve_args(data, where)`: the deploy stage's Serve app args.
    """

    name: str
    table: Mapping[str, Stage]
    check: Callable[[Mapping[str, Mapping[str, Any]], Mapping[str, str], Sequence[str], bool], None]
    not_applicable: Callable[[str, Mapping[str, Any], str], str | None]
    serve_args: Callable[[Mapping[str, Any], str], dict[str, Any]]


def _product_serve_args(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    from pipelines.jobs.experiment import serve_args

    return serve_args(checks.experiment(data, where))


def _multilingual_serve_args(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    return multilingual.serve_args(multilingual.config(data, where))


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe(DEFAULT, STAGES, checks.check_config, checks.not_applicable, _product_serve_args),
    Recipe("multilingual", multilingual.STAGES, multilingual.check, multilingual.not_applicable,
           _multilingual_serve_args),
)}


def recipe_of(data: Mapping[str, Any], where: str = "") -> Recipe:
    """The recipe a parsed config names with `recipe:` (an error naming the key and the known recipes otherwise)."""
    name = data.get("recipe", DEFAULT)
    if name not in RECIPES:
        raise ValueError(f"{where + ': ' if where else ''}recipe: {name!r} is not one of {', '.join(RECIPES)}")
    return RECIPES[name]
