"""The stage table: which module runs each stage of the pipeline, and each stage's identity (its key).

A stage is one `python -m <module> <args>` command over one experiment YAML. Its key hashes the stage name,
its command, the parsed config it reads (less the sections it `ignores`: those only later stages read) and the
key of the stage before it, so changing the config of a stage reruns it and every stage after it, while an
unchanged stage is skipped (see `markers`): a new `serve:` section redeploys without retraining, and aspect
heads added to a fine-tuned run (`train.aspects`) train on its encoder without fine-tuning it again.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from madr.config import config_hash
from madr.config_files import read_mapping


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: `python -m module *args`, where "{config}" in args is replaced by the config path.

    kind "module" runs the module; kind "deploy" deploys the Serve config (see `deploy`).
    `optional` stages are left out of `pipeline` unless named in --stages. `ignores`: config sections this stage
    never reads, top-level ("serve") or one level down ("train.aspects"), left out of its key; `reads`: the keys of
    an ignored section it does read ("serve.encoder_precision"), kept in its key. GPUs are not a
    property of the stage: its config asks for them (`distributed.use_gpu`, `encode.device`, the Serve
    deployments' `num_gpus`) on the workers it starts.
    """

    name: str
    module: str
    args: tuple[str, ...] = ("--config", "{config}")
    kind: str = "module"
    optional: bool = False
    help: str = ""
    ignores: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()

    def argv(self, config: str) -> list[str]:
        return [a.replace("{config}", config) for a in self.args]


_INDEX_ON = ("encode", "index", "tune", "evaluate", "serve")  # sections read from the encode stage on
_TRAINING = (*_INDEX_ON, "train.aspects")  # ... and what the training stages never read: the aspects stage's
STAGES: dict[str, Stage] = {s.name: s for s in (
    Stage("data", "pipelines.data.prepare",
          help="validate the catalog (or generate the synthetic one); corpus, eval/train queries + qrels, "
               "tokenizer, aspect vocabularies and statistics (Ray Data)",
          ignores=("train", "distributed", *_INDEX_ON)),
    Stage("pretrain", "pipelines.train", ("--config", "{config}", "--stage", "pretrain"), ignores=_TRAINING,
          help="MLM + aspect pretraining (paper 000 Eq. 7 / paper 001 Eq. 9)"),
    Stage("finetune", "pipelines.train", ("--config", "{config}", "--stage", "finetune"), ignores=_TRAINING,
          help="retrieval fine-tuning (paper 000 Eq. 8 / paper 001 Eq. 10)"),
    Stage("distill", "pipelines.train", ("--config", "{config}", "--stage", "distill"), optional=True,
          ignores=_TRAINING, help="distil the query tower into a small student (paper 004)"),
    Stage("aspects", "pipelines.aspect_heads", ignores=("distributed", *_INDEX_ON),
          help="aspect heads on the frozen fine-tuned encoder, calibrated on dev: explains, ranks as the encoder"),
    Stage("encode", "pipelines.jobs.experiment", ("encode", "--config", "{config}"),
          ignores=("tune", "evaluate", "serve"), help="corpus -> sharded FAISS (+ sparse / BM25) index + manifest"),
    Stage("tune", "pipelines.tune", ignores=("evaluate", "serve"),
          help="dense + BM25 fusion weight and normalisation chosen on the dev queries, into the manifest"),
    Stage("baseline", "pipelines.baseline", ignores=("evaluate", "serve"),
          help="the untrained backbone indexed and its fusion tuned on dev: the reference of eval.references"),
    Stage("mine", "pipelines.jobs.experiment", ("mine", "--config", "{config}"), optional=True,
          ignores=("evaluate", "serve"), help="hard negatives from the index for the next fine-tuning round"),
    Stage("evaluate", "pipelines.jobs.experiment", ("evaluate", "--config", "{config}"), ignores=("serve",),
          help="Recall/NDCG/MRR over the index, results table and recall-vs-latency plot"),
    Stage("deploy", "serve", (), kind="deploy",
          help="deploy the Ray Serve app (serve deploy to --address; serve run in the foreground without)"),
)}
ORDER: tuple[str, ...] = tuple(STAGES)


def load_table(path: str | Path | None) -> dict[str, Stage]:
    """The built-in table, or the one of a YAML file (`stages: [{name, module, args, optional}]`, in order).

    A table file replaces the built-in table: it adapts the pipeline (other entry points, extra stages)
    without code changes. Bad entries are errors naming the file and the entry.
    """
    if path is None:
        return dict(STAGES)
    data = load_yaml(path)
    entries = data.get("stages")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: expected a non-empty `stages:` list")
    table: dict[str, Stage] = {}
    known = {"name", "module", "args", "kind", "optional", "help", "ignores", "reads"}
    for i, entry in enumerate(entries):
        where = f"{path}: stages[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry.get("module"):
            raise ValueError(f"{where}: needs `name` and `module`")
        unknown = sorted(set(entry) - known)
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}; "
                             f"known: {', '.join(sorted(known))}")
        args = entry.get("args", ["--config", "{config}"])
        if not isinstance(args, list) or not all(isinstance(a, (str, int, float)) for a in args):
            raise ValueError(f"{where}: `args` must be a list of strings")
        if entry["name"] in table:
            raise ValueError(f"{where}: duplicate stage name {entry['name']!r}")
        if entry.get("kind", "module") not in ("module", "deploy"):
            raise ValueError(f"{where}: `kind` must be module or deploy")
        ignores = entry.get("ignores", [])
        if not isinstance(ignores, list) or not all(isinstance(x, str) for x in ignores):
            raise ValueError(f"{where}: `ignores` must be a list of top-level config section names")
        reads = entry.get("reads", [])
        if not isinstance(reads, list) or not all(isinstance(x, str) and "." in x for x in reads):
            raise ValueError(f"{where}: `reads` must be a list of SECTION.KEY names")
        table[entry["name"]] = Stage(entry["name"], str(entry["module"]), tuple(str(a) for a in args),
                                     kind=entry.get("kind", "module"),
                                     optional=bool(entry.get("optional", False)), help=str(entry.get("help", "")),
                                     ignores=tuple(ignores), reads=tuple(reads))
    return table


class StageUnavailable(RuntimeError):
    """A stage whose entry-point module is not in this checkout."""


def check_available(stage: Stage) -> None:
    """Fail with a clear message when `python -m stage.module` cannot run here."""
    if stage.kind != "module":
        return
    if not _runnable(stage.module):
        raise StageUnavailable(
            f"stage {stage.name!r} runs `python -m {stage.module}`, but {stage.module} is not in this "
            f"checkout (no module, or a package without __main__.py); see the stage table in "
            f"pipelines/jobs/stages.py")


def _runnable(module: str) -> bool:
    try:
        spec = importlib.util.find_spec(module)
    except (ModuleNotFoundError, ValueError):
        return False
    if spec is None:
        return False
    if spec.submodule_search_locations is not None:  # a package: needs __main__
        try:
            return importlib.util.find_spec(module + ".__main__") is not None
        except ModuleNotFoundError:
            return False
    return True


def select(names: Sequence[str] | None, table: Mapping[str, Stage] = STAGES) -> list[Stage]:
    """Stages to run, in table order: all non-optional ones, or exactly `names` (unknown names are errors)."""
    if not names:
        return [s for s in table.values() if not s.optional]
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ValueError(f"unknown stage(s) {', '.join(unknown)}; known: {', '.join(table)}")
    return [s for s in table.values() if s.name in set(names)]


def load_yaml(path: str | Path) -> dict[str, Any]:
    """The parsed config file (a mapping; `madr.config.read_mapping`), with the file named in errors."""
    return read_mapping(path)


def stage_keys(stages: Sequence[Stage], configs: Mapping[str, dict[str, Any]],
               table: Mapping[str, Stage] = STAGES) -> dict[str, str]:
    """Chained keys of every stage in `table` order: key(s) = hash(name, command, config of s less the
    sections s ignores, key(previous)).

    `configs` maps each stage name to the parsed config it runs with. Keys are computed over the whole
    table, whichever stages run, so one stage submitted alone has the key it has inside `pipeline`.
    """
    keys: dict[str, str] = {}
    previous = ""
    for stage in table.values():
        cfg = _without(configs.get(stage.name, {}), stage.ignores, stage.reads)
        previous = config_hash({"stage": stage.name, "module": stage.module, "args": list(stage.args),
                                "kind": stage.kind, "config": cfg, "previous": previous})
        keys[stage.name] = previous
    return {s.name: keys[s.name] for s in stages}


def _without(config: Mapping[str, Any], ignores: Sequence[str], reads: Sequence[str] = ()) -> dict[str, Any]:
    """`config` less the sections named in `ignores`: top-level ("serve") or one level down ("train.aspects"),
    but for the keys named in `reads` ("serve.encoder_precision")."""
    out = {k: v for k, v in config.items() if k not in ignores}
    for name in ignores:
        section, _, key = name.partition(".")
        if key and isinstance(out.get(section), Mapping):
            out[section] = {k: v for k, v in out[section].items() if k != key}
    for name in reads:
        section, _, key = name.partition(".")
        if isinstance(config.get(section), Mapping) and key in config[section]:
            out.setdefault(section, {})[key] = config[section][key]
    return out


@dataclass
class StageConfigs:
    """Which config file each stage reads: one default, optionally replaced per stage (NAME=PATH)."""

    default: str
    per_stage: dict[str, str] = field(default_factory=dict)

    def path(self, stage: str) -> str:
        return self.per_stage.get(stage, self.default)

    def parsed(self, table: Mapping[str, Stage] = STAGES) -> dict[str, dict[str, Any]]:
        cache: dict[str, dict[str, Any]] = {}
        out = {}
        for name in table:
            p = self.path(name)
            if p not in cache:
                cache[p] = load_yaml(p)
            out[name] = cache[p]
        return out
