"""The README's main job: the whole pipeline on this machine, ending with queries answered over HTTP.

1. start a single-node Ray cluster here (`ray start --head`, loopback only, token auth; `local_cluster`);
2. submit every stage of the experiment to it as a Ray job (`pipelines.jobs pipeline --address ...`):
   data -> pretrain -> finetune -> aspects -> encode -> tune -> baseline -> evaluate (each skipped once complete;
   a stage the recipe leaves out is recorded as skipped: configs/demo.yaml, the recommended product-search recipe,
   fine-tunes multilingual-e5-small with BM25-mined negatives and no pretraining, indexes it beside a BM25
   part whose fusion the tune stage picks on dev, and has the baseline stage index the untrained e5 the same
   way); then deploy the Ray Serve app over the index (`serve deploy`);
3. print the data statistics and the evaluation table (the recipe beside BM25 alone, the fine-tuned encoder
   alone and the untrained e5 + BM25), send sample queries (one per language) to `POST /search` and one to
   `POST /explain` over HTTP, print the answers (the explanation without its empty parts: for e5 its
   cosine score and the BM25 part's score and matched word pieces);
4. stop the cluster (or keep serving with `--serve`, until Ctrl-C).
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from typing import Any

import pyarrow.parquet as pq

from madr.config import ExperimentConfig, load_config
from madr.config_overrides import parse_overrides
from madr.layout import RunLayout

DEFAULT_CONFIG = "configs/demo.yaml"
# every stage in order; a stage the recipe leaves out is recorded as skipped
STAGES = "data,pretrain,finetune,aspects,encode,tune,baseline,evaluate,deploy"


def pipeline_argv(config: str, cluster: Any, port: int, overrides: list[str]) -> list[str]:
    argv = ["pipeline", "--config", config, "--address", cluster.address, "--token-file", cluster.token_file,
            "--same-host", "--stages", STAGES, "--serve-port", str(port), "--no-follow"]
    for pair in overrides:
        argv += ["--set", pair]
    return argv


def sample_queries(cfg: ExperimentConfig, per_language: int = 1) -> list[dict[str, str]]:
    """The first evaluation queries of each language, with their judged relevant products."""
    layout = RunLayout.of(cfg)
    queries = pq.read_table(layout.queries("eval")).to_pylist()
    picked: dict[str, list[dict[str, str]]] = {}
    for q in queries:
        bucket = picked.setdefault(q["language"], [])
        if len(bucket) < per_language:
            bucket.append(q)
    return [q for lang in sorted(picked) for q in picked[lang]]


def judged(cfg: ExperimentConfig) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for row in pq.read_table(RunLayout.of(cfg).qrels("eval")).to_pylist():
        out.setdefault(row["query_id"], {})[row["product_id"]] = int(row["relevance"])
    return out


def http_json(url: str, body: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
    """GET (no body) or POST (JSON body) `url` and decode the JSON answer. The demo speaks plain HTTP, as any
    client of the API would (stdlib only: `pipelines` does not depend on `serve`)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.loads(reply.read())


def wait_ready(url: str, timeout: float = 120.0, interval: float = 0.5) -> None:
    """Poll `GET /ready` until it answers 200; raise with the last error after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            http_json(f"{url}/ready")
            return
        except (urllib.error.URLError, ConnectionError) as e:  # HTTPError is a URLError
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} not ready after {timeout} s: {e}") from e
            time.sleep(interval)


def answer_queries(cfg: ExperimentConfig, url: str, k: int = 3) -> list[dict[str, Any]]:
    """Sample queries over HTTP; prints each hit with its judged relevance (0-4, '-' unjudged)."""
    grades = judged(cfg)
    answers = []
    wait_ready(url)
    samples = sample_queries(cfg)
    for q in samples:
        reply = http_json(f"{url}/search", {"query": q["text"], "k": k, "include_docs": True})
        answers.append(reply)
        print(f"\nPOST {url}/search  {json.dumps({'query': q['text'], 'k': k}, ensure_ascii=False)}"
              f"  [{q['language']}, {reply['took_ms']:.0f} ms]")
        for rank, hit in enumerate(reply["results"], 1):
            doc = hit.get("doc") or {}
            grade = grades.get(q["query_id"], {}).get(doc.get("product_id", ""), "-")
            print(f"  {rank}. {hit['score']:.3f}  {doc.get('title', hit['id'])}  (relevance {grade})")
    # the English sample's first answer: the BM25 part's word pieces are English ones, so its matches show
    candidates = [a for a, q in zip(answers, samples, strict=True) if q["language"] == "en"] + answers
    if candidates and candidates[0]["results"]:
        first = candidates[0]
        top = first["results"][0]
        explained = http_json(f"{url}/explain", {"query": first["query"], "doc_id": top["id"]})
        print(f"\nPOST {url}/explain  query {first['query']!r}, document {top['id']}:")
        shown = _short(explained)
        if "aspect_match" in shown:  # after the scores it adds to
            shown["aspect_match"] = shown.pop("aspect_match")
        print(json.dumps(shown, ensure_ascii=False, indent=1)[:4000])
    return answers


def _short(obj: Any, items: int = 5) -> Any:
    """Long lists and mappings cut to their first `items` entries and empty ones left out (a model without
    aspect heads explains no aspects), aspect values as "value probability", for printing."""
    if isinstance(obj, dict):
        kept = {k: _short(v, items) for k, v in obj.items()}
        kept = {k: v for k, v in kept.items() if v not in ([], {}, None)}
        return dict(list(kept.items())[: max(items, 12)])
    if isinstance(obj, list):
        if obj and all(isinstance(v, dict) and set(v) == {"value", "probability"} for v in obj):
            return [f"{v['value']} {v['probability']:.2f}" for v in obj[:3]]
        return [_short(v, items) for v in obj[:items]]
    return round(obj, 4) if isinstance(obj, float) else obj


def show_results(cfg: ExperimentConfig) -> None:
    layout = RunLayout.of(cfg)
    summary = json.loads((layout.data / "summary.json").read_text())
    print(f"\ndata: {summary['origin']}: {json.dumps(summary['counts'])}")
    table = layout.evaluation / "results.md"
    if table.is_file():
        print(f"\nevaluation ({layout.evaluation}):\n{table.read_text()}")


def run_demo(config: str | None = None, overrides: list[str] | None = None, port: int = 8000,
             keep_serving: bool = False, num_cpus: int | None = None) -> int:
    """The main job (module docstring). Returns the process exit code."""
    from pipelines.jobs import cli as jobs_cli
    from pipelines.jobs import local_cluster

    config = config or DEFAULT_CONFIG
    overrides = list(overrides or [])
    cfg = load_config(config, parse_overrides(overrides))
    print(f"madr demo: {cfg.model.name} on {cfg.model.backbone.name_or_path or 'a tiny random BERT'}, "
          f"output {cfg.output_dir}", flush=True)
    started = time.perf_counter()
    cluster = local_cluster.start(num_cpus=num_cpus or os.cpu_count())
    print(f"[demo] local Ray cluster {cluster.address} (dashboard and jobs API, loopback only)", flush=True)
    try:
        rc = jobs_cli.main(pipeline_argv(config, cluster, port, overrides))
        if rc != 0:
            return rc
        show_results(cfg)
        answer_queries(cfg, f"http://127.0.0.1:{port}")
        print(f"\nmadr demo: done in {time.perf_counter() - started:.0f} s", flush=True)
        if keep_serving:
            print(f"serving on http://127.0.0.1:{port} (docs: /docs); Ctrl-C stops", flush=True)
            _wait_for_interrupt()
        return 0
    finally:
        local_cluster.stop(cluster)


def _wait_for_interrupt() -> None:
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
