"""The public ESCI samples with product text (Amazon Shopping Queries, paper 001 Sec. 5.1) as a madr catalog.

The full ESCI product file was not obtainable (../shared/data/README.md); two samples carry product text:
`esci_sample_with_product_text_grandi9.parquet` (485 Exact judgments over 50 US queries) and
`esci_exact_sample100_with_product_text.parquet` (100 Exact judgments over 6 queries, US and ES). Both hold
Exact ("E") judgments only, so a catalog made from them supports retrieval metrics over its products (every
judged product is relevant, every other product of the sample counts as not relevant) but no re-ranking
metric. Products keep the catalog's own brand and colour fields as aspects (paper 001 uses the catalog's
fields); queries get no aspect annotation. Every query is a test query: the catalog is for evaluation only.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from madr.data.schema import Catalog, Judgment, Product, Query
from madr.data.sources.parquet_rows import read_rows, text_field

TEXT_SAMPLES = ("esci_sample_with_product_text_grandi9.parquet", "esci_exact_sample100_with_product_text.parquet")
COLUMNS = ("query", "product_id", "product_locale", "product_title", "product_brand", "product_color")
EXACT_RELEVANCE = 4  # the top grade of the catalog's 0-4 scale (Home Depot's "E" is 3-4)


def _aspects(brand: str, color: str) -> dict[str, list[str]]:
    return {"brand": [brand.lower()] if brand else [], "color": [color.lower()] if color else []}


def esci_text_catalog(data_dir: str | Path, locales: Sequence[str] = ("us",),
                      files: Sequence[str] = TEXT_SAMPLES) -> Catalog:
    """The judgments of `files` (under `data_dir`) in `locales` as a test-only catalog: products (title, brand
    and colour aspects), queries (ids "esci-<n>" in order of first appearance) and Exact judgments."""
    products: dict[str, Product] = {}
    queries: dict[str, Query] = {}
    judgments: dict[tuple[str, str], Judgment] = {}
    for name in files:
        path = Path(data_dir) / name
        for i, row in enumerate(read_rows(path, COLUMNS)):
            if text_field(path, i, row, "product_locale") not in locales:
                continue
            text, pid = text_field(path, i, row, "query"), text_field(path, i, row, "product_id")
            if pid not in products:
                brand, color = (text_field(path, i, row, f"product_{n}", False) for n in ("brand", "color"))
                products[pid] = Product(pid, text_field(path, i, row, "product_title"), "", _aspects(brand, color))
            query = queries.setdefault(text, Query(f"esci-{len(queries)}", text, {}, "test"))
            judgments[(query.query_id, pid)] = Judgment(query.query_id, pid, EXACT_RELEVANCE, "E")
    if not judgments:
        raise ValueError(f"{data_dir}: no judgment in locales {list(locales)} in {list(files)}")
    return Catalog(list(products.values()), list(queries.values()), list(judgments.values()),
                   ["brand", "color"]).validate({k: f"{data_dir} (ESCI {k})" for k in ("products", "queries",
                                                                                     "judgments")})
