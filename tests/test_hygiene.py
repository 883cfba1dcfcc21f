"""Repository hygiene, without importing anything:

- product code (madr, pipelines, serve, cluster, scripts) says what the code does and why, not which issue asked
  for it or which section of benchmarks/RESULTS.md measured it: no "issue 23" / "Issue 27:" / "issue-26" / "(#24)"
  and no "RESULTS" in its code, comments, docstrings or configs;
- tests, configs and the benchmarks' code say what they test, set or measure, not which issue asked for it:
  no issue numbers there either (benchmarks/*.md is history and may cite issues and RESULTS; this file's own
  examples are not scanned);
- the benchmarks' modules import each other without a cycle.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("madr", "pipelines", "serve", "cluster", "scripts")
TEXT_SUFFIXES = {
    ".py",
    ".sh",
    ".yaml",
    ".yml",
    ".toml",
    ".json",
    ".md",
    ".txt",
    ".cfg",
    ".ini",
    ".j2",
    ".tpl",
}

# "issue 23", "Issue 27:", "issues 23 and 24", "issue-26", "issue #24"
ISSUE_WORD = re.compile(r"\bissues?[ \t-]*#?\d+", re.IGNORECASE)
# "#24" / "(#24)" as a reference: after a space, "(", "[" or a line start, before a space, closing bracket,
# punctuation or the line end. Not hex colours ('"#333"', "#1f77b4"), HTML entities ("&#39;"), URL fragments
# ("page#24"), shell's "$#" or "${#a[@]}", comments (noqa pragmas, "# 24 rows"), another project's issue
# ("huggingface/tokenizers#1794") nor its pull request ("PR #2066").
HASH_REF = re.compile(r"(?:^|(?<=[\s(\[]))#\d+(?=[\s)\],.;:]|$)", re.MULTILINE)
UPSTREAM_PR = re.compile(r"\b(?:PRs?|pull requests?)\s*$", re.IGNORECASE)  # what precedes "#N" there
RESULTS_REF = re.compile(r"\bRESULTS\b")
CHECKS = {"issue reference": ISSUE_WORD, "#N reference": HASH_REF, "RESULTS reference": RESULTS_REF}
ISSUE_CHECKS = {what: pattern for what, pattern in CHECKS.items() if pattern is not RESULTS_REF}


def text_files(top: str, suffixes: set[str] = TEXT_SUFFIXES) -> list[Path]:
    files = []
    for path in sorted((ROOT / top).rglob("*")):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        if path.suffix in suffixes or path.name in ("Dockerfile", "Makefile"):
            files.append(path)
    return files


def product_files() -> list[Path]:
    return [path for top in PRODUCT for path in text_files(top)]


def issue_scanned_files() -> list[Path]:
    """tests/ (less this file, whose examples are references on purpose), configs/ and benchmarks/**/*.py."""
    files = [p for p in text_files("tests") if p != Path(__file__).resolve()]
    return files + text_files("configs") + text_files("benchmarks", {".py"})


def offences(text: str, checks: dict[str, re.Pattern[str]] = CHECKS) -> list[str]:
    """`what: line` for each reference `text` holds (of the kinds in `checks`)."""
    found = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for what, pattern in checks.items():
            for m in pattern.finditer(line):
                if pattern is HASH_REF and UPSTREAM_PR.search(line[: m.start()]):
                    continue
                found.append(f"{lineno}: {what} {m.group(0)!r}: {line.strip()}")
    return found


@pytest.mark.parametrize(
    "text",
    [
        "a replica that hangs (issue 24: the agents lived on)",
        "Issue 27 settings (defaults reproduce the paper's recipe):",
        "the issue-26 way to make each step cheaper",
        "as issues 23 and 24 found",
        "fixed in (#24)",
        "see #31.",
        '# see benchmarks/RESULTS.md, "Bursts of good requests"',
        "1.7x the fp32 job (RESULTS, issue 23)",
    ],
)
def test_references_are_found(text):
    assert offences(text)


@pytest.mark.parametrize(
    "text",
    [
        'color="#1f77b4"',
        'ax.plot(x, y, c="#333")',
        "x = 1  # noqa: E402",
        "# 24 rows per block",
        "Children&#39;s",
        "https://example.org/page#24",
        'if [ "$#" -lt 2 ]; then echo "${#args[@]}"; fi',
        "results.md / results.csv",
        "the search results of each query",
        "paper 002 Sec. 4.2 / Fig. 2",
        "TISSUE 3",
        "(huggingface/tokenizers#1794, fix proposed in PR #2066)",
    ],
)
def test_legitimate_text_passes(text):
    assert offences(text) == []


def offences_in(files: list[Path], checks: dict[str, re.Pattern[str]]) -> dict[str, list[str]]:
    """path -> its offences, for each of `files` that has any."""
    found = {}
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        hits = offences(text, checks)
        if hits:
            found[str(path.relative_to(ROOT))] = hits
    return found


def report(found: dict[str, list[str]]) -> str:
    return "\n".join(f"{path}:{hit}" for path, hits in found.items() for hit in hits)


def test_product_code_has_no_issue_or_results_references():
    files = product_files()
    assert any(p.suffix == ".py" for p in files)
    found = offences_in(files, CHECKS)
    why = "say what the code does, not which issue or RESULTS section it came from:\n"
    assert not found, why + report(found)


def test_issue_checks_leave_results_alone():
    assert offences("1.7x the fp32 job (RESULTS, issue 23)", ISSUE_CHECKS)
    assert offences("see benchmarks/RESULTS.md, Indexing and encoding", ISSUE_CHECKS) == []


def test_tests_configs_and_benchmark_code_have_no_issue_references():
    files = issue_scanned_files()
    tops = {p.relative_to(ROOT).parts[0] for p in files}
    assert tops == {"tests", "configs", "benchmarks"}
    assert Path(__file__).resolve() not in files
    assert all(p.suffix == ".py" for p in files if p.relative_to(ROOT).parts[0] == "benchmarks")
    found = offences_in(files, ISSUE_CHECKS)
    why = "say what the test, config or benchmark is about, not which issue asked for it:\n"
    assert not found, why + report(found)


def module_imports(package: str) -> dict[str, set[str]]:
    """module -> the modules of `package` it imports (at any depth of its code, relative imports resolved)."""
    modules: dict[str, Path] = {}
    for path in (ROOT / package).rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path

    def known(name: str) -> str | None:  # the innermost module of `package` that `name` is or lies in
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                deps.update(known(a.name) for a in node.names if a.name.split(".")[0] == package)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    parent = parent[: len(parent) - node.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                if base.split(".")[0] != package:
                    continue
                for a in node.names:  # `from pkg import submodule` imports the submodule
                    full = f"{base}.{a.name}"
                    deps.add(full if full in modules else known(base))
        graph[name] = {d for d in deps if d is not None and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_cycle_finder():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"b"}}) == []


def test_benchmarks_have_no_import_cycle():
    graph = module_imports("benchmarks")
    assert "benchmarks.quality.homedepot_hybrid" in graph
    assert cycles(graph) == []
