"""The README and every page under docs/ name only what exists: modules run with `python -m`, make targets,
repository paths, relative links and their anchors, and config keys (resolved through the typed config
classes); the README stays a front page (at most 20 KB)."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = ("configs/", "serve/", "scripts/", "cluster/", "madr/", "pipelines/", "benchmarks/", "tests/", "docs/")
PLACEHOLDER = re.compile(r"[<>*{}$]|NNNN|\.\.\.|/X\b")


def _ids(pages: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in pages]


def _code(text: str) -> list[str]:
    """Inline code spans and the lines of fenced blocks."""
    fenced = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return inline + [line for block in fenced for line in block.splitlines()]


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_readme_is_a_front_page():
    readme = (ROOT / "README.md").read_bytes()
    assert len(readme) <= 20_000, f"README.md is {len(readme)} bytes; move detail into docs/"
    for page in ("pipeline", "cluster", "serving", "data", "configuration", "multilingual", "export", "development"):
        assert f"docs/{page}.md" in readme.decode(), f"the README does not link docs/{page}.md"


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_modules_run_with_python_m_exist(page):
    modules = set(re.findall(r"python -m ([A-Za-z_][\w.]*)", page.read_text()))
    missing = [m for m in sorted(modules) if importlib.util.find_spec(m) is None]
    assert not missing, f"{page.name} runs modules that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_make_targets_exist(page):
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.M))
    named = {t for line in _code(page.read_text()) for t in re.findall(r"\bmake ([a-z][\w-]*)", line)}
    assert named <= targets, f"{page.name} names make targets that do not exist: {sorted(named - targets)}"


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_repository_paths_exist(page):
    missing = []
    for span in _code(page.read_text()):
        for token in re.findall(r"(?<![\w./~-])((?:" + "|".join(map(re.escape, TOP)) + r")[\w./-]*)", span):
            token = token.rstrip(".,:;)")
            if PLACEHOLDER.search(token) or token.startswith("tests/") and "::" in token:
                continue
            if not (ROOT / token).exists():
                missing.append(token)
    assert not missing, f"{page.name} names paths that do not exist: {sorted(set(missing))}"


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_relative_links_and_anchors_exist(page):
    text = page.read_text()
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", file.read_text(), flags=re.M)
            if anchor not in {_slug(h) for h in headings}:
                broken.append(target)
    assert not broken, f"{page.name} has broken links: {broken}"


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _section_classes() -> dict[str, type]:
    from madr.config import ExperimentConfig
    from madr.job_settings import section_classes

    hints = typing.get_type_hints(ExperimentConfig)
    classes = {f.name: hints[f.name] for f in dataclasses.fields(ExperimentConfig)}
    classes.update(section_classes())  # the mapping sections: the classes that define their keys
    return classes


def _resolves(cls: typing.Any, path: list[str]) -> bool:
    for name in path:
        cls = next((a for a in (typing.get_args(cls) or (cls,)) if dataclasses.is_dataclass(a)), cls)
        if not dataclasses.is_dataclass(cls):
            return True  # a mapping's keys (e.g. runtime_env) are not the config's to check
        if name not in {f.name for f in dataclasses.fields(cls)}:
            return False
        cls = typing.get_type_hints(cls)[name]
    return True


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_config_keys_exist(page):
    classes = _section_classes()
    pattern = re.compile(r"(?<![\w./@-])(" + "|".join(classes) + r")\.([a-z_][\w.]*[a-z_])(?![\w/(-])")
    unknown = []
    for span in _code(page.read_text()):
        for section, rest in pattern.findall(span):
            if span.strip().startswith(("python", "from ", "import ")) and f"{section}.{rest}" not in span.split("=")[0]:
                continue
            if rest.endswith("py") or importlib.util.find_spec(section) and _is_module(f"{section}.{rest}"):
                continue  # a file or a module (serve.client), not a key
            if not _resolves(classes[section], rest.split(".")):
                unknown.append(f"{section}.{rest}")
    assert not unknown, f"{page.name} names config keys that do not exist: {sorted(set(unknown))}"
