"""One searcher of an evaluation or mining run: an index manifest, the model that encodes its queries and the
search settings (`SearchParams`). The evaluate job's `runs:` (`madr.evaluate_config.EvaluateConfig`) and the
mining job's `run:` are lists / one of these; `pipelines.evaluate.searcher` runs them."""

from __future__ import annotations

from dataclasses import dataclass, field

from madr.config import from_dict
from madr.search.params import SearchParams
from madr.serve_config import (
    ASPECT_FILTER_MODES,
    ASPECT_MIN_CONFIDENCE,
    ENCODER_BACKENDS,
    ENCODER_PRECISIONS,
    check_aspect_confidence,
)


@dataclass
class SearchSpec:
    """One searcher: an index manifest, the model that encodes queries (default: the manifest's), and the
    search settings (YAML ``search:``; ``lam`` None = the manifest's, dense-only for dense indexes; ``k`` is
    the job's: the evaluation depth or the mining ``rank_max``). ``encoder_backend`` ("torch", default, or "onnx":
    the query tower exported to onnxruntime) and ``encoder_precision`` ("fp32", the model as saved, or "int8": its
    query tower's Linear layers dynamically quantised, `madr.export.quantize`) build the query encoder a Serve app
    with the same two settings runs (`madr.search.query_encoder.build_query_encoder`), so a run scores what that
    app serves. ``aspect_filter`` ("filter" or "boost"; indexes with aspect data) then filters / boosts each query's
    ranked results by its own predicted aspect values of confidence >= ``aspect_confidence``, as ``/search``'s
    ``aspect_filter`` does (`madr.search.aspect_match.predicted_filter`)."""

    name: str = "model"
    index: str = ""
    model_dir: str | None = None
    search: SearchParams = field(default_factory=SearchParams)
    encoder_precision: str = "fp32"
    encoder_backend: str = "torch"
    aspect_filter: str | None = None
    aspect_confidence: float = ASPECT_MIN_CONFIDENCE

    def __post_init__(self) -> None:
        if isinstance(self.search, dict):
            self.search = from_dict(SearchParams, self.search, "search.")
        if self.encoder_precision not in ENCODER_PRECISIONS:
            raise ValueError(f"encoder_precision must be one of {', '.join(ENCODER_PRECISIONS)}, "
                             f"got {self.encoder_precision!r}")
        if self.encoder_backend not in ENCODER_BACKENDS:
            raise ValueError(f"encoder_backend must be one of {', '.join(ENCODER_BACKENDS)}, "
                             f"got {self.encoder_backend!r}")
        if self.aspect_filter is not None and self.aspect_filter not in ASPECT_FILTER_MODES:
            raise ValueError(f"aspect_filter must be one of {', '.join(ASPECT_FILTER_MODES)} or null, "
                             f"got {self.aspect_filter!r}")
        check_aspect_confidence(self.aspect_confidence, "aspect_confidence")
