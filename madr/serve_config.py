"""The Serve app's settings (`ServeSettings`, one `DeploymentSettings` per deployment): the `args:` of
`serve_config.yaml`, a Serve settings YAML, and the `serve:` section of an experiment, whose keys override what the
deploy stage derives from the experiment (`madr.job_settings.serve_args`) and are checked when the experiment loads.

Plain data and their checks; what needs Ray Serve, the network or the index (the deployments' `options`, where the
API binds and its key, pulling the index) is `serve.config`'s. Unknown keys are errors naming their dotted path
(`madr.config.from_dict`), so a typo in a Serve config never silently falls back to a default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from madr.search.params import SearchParams

DEFAULT_API_KEY_ENV = "MADR_API_KEY"
TOPOLOGIES = ("colocated", "fanout")
ENCODER_BACKENDS = ("torch", "onnx")  # what runs the query tower's forward pass (ServeSettings.encoder_backend)
ENCODER_PRECISIONS = ("fp32", "int8")  # its weights' precision (ServeSettings.encoder_precision)
ASPECT_FILTER_MODES = ("filter", "boost")  # aspect-aware retrieval: keep, or rank first, the matching candidates
ASPECT_MIN_CONFIDENCE = 0.7  # the confidence a query's predicted aspect value needs to filter / boost by


def check_aspect_confidence(value: float, key: str) -> None:
    """An aspect filter's confidence (presence x calibrated probability) is in (0, 1]; else a ValueError naming
    ``key``."""
    if isinstance(value, bool) or not 0.0 < value <= 1.0:
        raise ValueError(f"{key} must be in (0, 1], got {value!r}")


@dataclass
class DeploymentSettings:
    """Scaling and resources of one deployment; a `deployments:` entry in the Serve YAML overrides these.

    `autoscaling` is a Ray Serve `autoscaling_config` mapping (min_replicas, max_replicas,
    target_ongoing_requests, ...); when set it replaces `num_replicas`. `health_check_period_s` is how often
    the controller checks a replica, i.e. how soon a dead one is noticed and a replacement started (1 s here;
    Serve's default, 10 s, leaves a dead replica unnoticed that long); `health_check_timeout_s` how long a
    check may take before a live but frozen replica is replaced (5 s; None: Serve's 30 s). A replica whose batch
    is stuck in a long call fails its check itself (`serve.watchdog`). `num_replicas: 2` keeps a replica's death
    invisible to clients (the other answers; see `serve.calls`). `max_replicas_per_node`
    (None: no limit) caps the replicas Serve places on one node: 1 puts every replica on a node of its own, so
    that losing a node loses one replica of the deployment, not all of them (multi-node clusters).
    `max_queued_requests` (None: no bound) caps the calls each caller (Serve's proxy, the ingress) holds in its
    queue for the deployment while every replica is at `max_ongoing_requests`; a call beyond it is refused at
    once, HTTP 503 + ``Retry-After: 1`` (Serve's backpressure). Set it on the deployment that takes HTTP (the
    ingress, `Colocated`) to shed a burst larger than the app can answer within `request_timeout_s`.
    `num_gpus` (the deployments that hold the query tower: `encoder`, `colocated`): the GPUs each replica asks Ray
    for (its `ray_actor_options`; an autoscaler adds a GPU node for it); a replica given a GPU runs the query tower
    on it (`serve.deployments.replica_device`). `serve.config.deployment_options` turns these into the deployment's
    `Deployment.options(...)`.
    """

    num_replicas: int = 1
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    max_ongoing_requests: int = 64
    autoscaling: dict[str, Any] | None = None
    health_check_period_s: float | None = 1.0
    health_check_timeout_s: float | None = 5.0
    max_replicas_per_node: int | None = None
    max_queued_requests: int | None = None

    def __post_init__(self) -> None:
        if self.max_queued_requests is not None and self.max_queued_requests < 1:
            raise ValueError(f"max_queued_requests must be >= 1 or None (no bound), got {self.max_queued_requests}")
        if self.num_gpus < 0:
            raise ValueError(f"num_gpus must be >= 0, got {self.num_gpus}")

    def min_cpus(self) -> float:
        """CPUs its replicas hold at the smallest scale (autoscaling: `min_replicas`, default 1)."""
        replicas = (self.autoscaling or {}).get("min_replicas", 1) if self.autoscaling else self.num_replicas
        return replicas * self.num_cpus


@dataclass
class ServeSettings:
    """Everything the HTTP app and its deployments need.

    Index / model: `manifest_path` (a `madr.index` manifest JSON or its directory; on object storage, a URI
    below a run's `output_dir`, downloaded with its model into the run's local mirror by `madr.storage.pull_index`
    when a replica opens it: `serve.config.require_manifest`),
    `model_dir` (None: the manifest's).
    Topology (`serve/colocated.py`): `colocated` (the default, for small nodes): one deployment whose replicas
    each serve HTTP, encode and search every shard (`colocated` settings: replicas, CPUs); `fanout` (clusters):
    an ingress, a `QueryEncoder` deployment (`encoder`) and shard-group deployments (`searcher`, `shard_groups`),
    a handle hop between them. Same API, same answers. On a small node co-located answers faster at every
    concurrency: it skips the two handle hops fan-out pays per query.
    Searchers: the manifest's shards are split into `shard_groups` contiguous groups, one `ShardSearcher`
    deployment per group (`searcher-0`, `searcher-1`, ...), each with its own replicas.
    Query encoder: `encoder_index_vocabulary` (hybrid models; off by default) projects queries onto the terms
    the index's sparse shards hold only (`madr.search.query_encoder.LeanQueryEncoder`): a faster MLM projection,
    with the top-k cut taken over those terms (results can then differ from the offline reference).
    `encoder_backend`: "torch" (default) or "onnx": the query tower exported at replica start
    (`madr.export.onnx`) and run in onnxruntime with `torch_threads` threads, the same vectors;
    "onnx" needs `pip install "madr[export]"` and projects onto the whole vocabulary
    (not with `encoder_index_vocabulary`). `encoder_precision`: "fp32" (default) or "int8": the query tower's Linear
    layers dynamically quantised to int8 at replica start (`madr.export.quantize`; with "torch" a qint8 copy of the
    tower, with "onnx" the exported graph quantised by onnxruntime); vectors close to, not equal to, fp32's.
    Search settings: `search` (`madr.search.params.SearchParams`, YAML section `search:`): `candidates`,
    `nprobe`, `ef_search` for every shard (None: the index defaults) and `lam` for requests that do not send
    one (None: the index's `hybrid_lambda`); `k` comes with each request.
    Validation: `max_query_chars`, `max_k`, `max_encode_texts`, `max_body_bytes` (HTTP 413 above it),
    `max_header_bytes` (431), `body_timeout_s` (408 when a body chunk takes longer to arrive).
    Filters (post-filters on DocStore fields, see serve/app.py): `filter_fields` (None: every DocStore
    column but the id and the text field), fetch `k * filter_overfetch` candidates, doubling up to
    `max_filter_fetch` until `k` documents match.
    `/explain` by `doc_id` explains the DocStore's `doc_text_field` (None: the first of `text`, `title` the
    DocStore has; the encode job writes `title`).
    Auth: the API key is `api_key` or, when that is None, the environment variable `api_key_env` read on the
    ingress replica; empty or unset = no key (`serve.config.resolved_api_key`). Clients send it as `X-API-Key: <key>` or
    `Authorization: Bearer <key>`. Fail closed: an app whose `host` is not a loopback address refuses to start
    without a key unless `public` is true (an open API on purpose; `serve.config.check_exposure`). `host` is where `run_local` and the plain
    server bind; in a Serve YAML set it to the `http_options.host` the proxy binds.
    Failures (`serve.calls`, `serve.routing`): busy is not dead. A call to a deployment whose replicas are all
    busy waits in its router's queue, bounded by `request_timeout_s` (the whole request's deadline: HTTP 504 +
    Retry-After after it) and, at the ingress, by `max_queued_requests` (`DeploymentSettings`; 256 for `ingress`
    and `colocated` unless set: HTTP 503 + `Retry-After: 1` at once beyond it) and `queue_timeout_s` (a request that
    would wait longer than this in Serve's proxy for a busy ingress replica, judged on its arrival from the rate at
    which the replicas finish requests, gets 503 + `Retry-After: 1` at once; None: half of `request_timeout_s`; one
    admitted waits its turn, at most `request_timeout_s`, which starts again once a replica has taken it). `route_timeout_s`: how long a call
    may wait while its deployment has no live replica (every replica died, Serve is replacing them; also in
    Serve's proxy, both topologies): HTTP 503 + `Retry-After: 1` after it. `replica_retries`: how often a call
    whose replica died, or did not take or answer it, is sent again (to another replica when there is one);
    `call_timeout_s`: how long the replica a call was sent to may take to take it (a frozen replica), and then to
    answer it (a hung one), before the call is sent again or, on its last attempt, answered 503 / 504 +
    `Retry-After: 1` (None: only `request_timeout_s` bounds it). Keep (replica_retries + 1) x call_timeout_s
    below request_timeout_s. A replica whose batch runs longer than `request_timeout_s` fails its health check
    and is replaced (`serve.watchdog`).
    Logging (`run_local` only; the Serve YAML has its own `logging_config`): `log_level`, `access_log` (Serve's
    access log, and with it each `/search` request's stage breakdown, `serve.latency`).
    """

    manifest_path: str = ""
    model_dir: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    api_key_env: str = DEFAULT_API_KEY_ENV
    public: bool = False
    max_query_chars: int = 512
    max_k: int = 100
    max_encode_texts: int = 32
    max_body_bytes: int = 16384
    max_header_bytes: int = 16384
    body_timeout_s: float = 5.0
    filter_fields: list[str] | None = None
    doc_text_field: str | None = None
    filter_overfetch: int = 10
    max_filter_fetch: int = 1000
    search: SearchParams = field(default_factory=SearchParams)
    shard_groups: int = 1
    mmap: bool = False
    verify: bool = True
    torch_threads: int = 1
    faiss_threads: int = 1
    encoder_max_batch_size: int = 64
    encoder_batch_wait_timeout_s: float = 0.003
    encoder_index_vocabulary: bool = False
    encoder_backend: str = "torch"
    encoder_precision: str = "fp32"
    searcher_max_batch_size: int = 64
    ingress_coalesce: int = 64  # fan-out: the ingress sends up to this many concurrent requests' hops as one
    # call, a few calls in flight per hop (serve.coalesce); 1: a call per request
    searcher_batch_wait_timeout_s: float = 0.001
    request_timeout_s: float = 10.0
    route_timeout_s: float = 1.0
    queue_timeout_s: float | None = None
    replica_retries: int = 1
    call_timeout_s: float | None = 2.0
    log_level: str = "INFO"
    access_log: bool = True
    encoder: DeploymentSettings = field(default_factory=DeploymentSettings)
    searcher: DeploymentSettings = field(default_factory=DeploymentSettings)
    ingress: DeploymentSettings = field(default_factory=lambda: DeploymentSettings(num_cpus=0.5, max_queued_requests=256))
    topology: str = "colocated"
    colocated: DeploymentSettings = field(default_factory=lambda: DeploymentSettings(max_queued_requests=256))

    def __post_init__(self) -> None:
        positive = ("max_query_chars", "max_k", "max_encode_texts", "max_body_bytes", "max_header_bytes",
                    "filter_overfetch", "max_filter_fetch", "shard_groups", "torch_threads", "faiss_threads",
                    "encoder_max_batch_size", "searcher_max_batch_size", "ingress_coalesce", "port")
        for name in positive:
            if int(getattr(self, name)) < 1:
                raise ValueError(f"serve.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_filter_fetch < self.max_k:
            raise ValueError(f"serve.max_filter_fetch ({self.max_filter_fetch}) must be >= max_k "
                             f"({self.max_k})")
        if self.body_timeout_s <= 0:
            raise ValueError(f"serve.body_timeout_s must be > 0, got {self.body_timeout_s}")
        for name in ("request_timeout_s", "route_timeout_s", "queue_timeout_s", "call_timeout_s"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"serve.{name} must be > 0, got {getattr(self, name)}")
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"serve.topology must be one of {', '.join(TOPOLOGIES)}, got {self.topology!r}")
        if self.replica_retries < 0:
            raise ValueError(f"serve.replica_retries must be >= 0, got {self.replica_retries}")
        if self.encoder_backend not in ENCODER_BACKENDS:
            raise ValueError(f"serve.encoder_backend must be one of {', '.join(ENCODER_BACKENDS)}, "
                             f"got {self.encoder_backend!r}")
        if self.encoder_backend == "onnx" and self.encoder_index_vocabulary:
            raise ValueError("serve.encoder_backend 'onnx' projects onto the whole vocabulary; "
                             "encoder_index_vocabulary needs the torch encoder")
        if self.encoder_precision not in ENCODER_PRECISIONS:
            raise ValueError(f"serve.encoder_precision must be one of {', '.join(ENCODER_PRECISIONS)}, "
                             f"got {self.encoder_precision!r}")
        self._check_gpus()

    def _check_gpus(self) -> None:
        """GPUs only where the query tower runs (`encoder`, `colocated`), and only for its torch fp32 forward pass:
        the searchers and the ingress never use one, ONNX and int8 run on the CPU."""
        for name in ("searcher", "ingress"):
            if getattr(self, name).num_gpus:
                raise ValueError(f"serve.{name}.num_gpus must be 0: nothing in a {name} replica uses a GPU")
        gpus = self.colocated.num_gpus if self.topology == "colocated" else self.encoder.num_gpus
        if gpus and (self.encoder_backend, self.encoder_precision) != ("torch", "fp32"):
            raise ValueError(f"serve: a query tower on a GPU needs encoder_backend 'torch' and "
                             f"encoder_precision 'fp32' (got {self.encoder_backend!r}, {self.encoder_precision!r}: "
                             f"they run on the CPU); set num_gpus: 0 or use them")

    def ingress_queue_timeout_s(self) -> float:
        """The longest predicted wait in Serve's proxy for a busy ingress replica a request is admitted with
        (`queue_timeout_s`)."""
        return self.queue_timeout_s if self.queue_timeout_s is not None else self.request_timeout_s / 2

    def ingress_max_wait_s(self) -> float:
        """How long an admitted request may wait in Serve's proxy: its deadline (`request_timeout_s`), or
        `queue_timeout_s` when that is longer."""
        return max(self.request_timeout_s, self.ingress_queue_timeout_s())
