"""Catalog data: the parquet schema shared by real and synthetic data, the synthetic generator, the readers of
public layouts (`beir`: BEIR directories, `trec`: TREC qrels in, TREC runs out) and the Ray-free row
validation (`validation`) and quarantine (`quarantine`) that they and `pipelines.data` share."""

from madr.data.schema import ESCI_LABELS, SPLITS, Catalog, Judgment, Product, Query
from madr.data.synthetic.catalog import generate_catalog

__all__ = ["ESCI_LABELS", "SPLITS", "Catalog", "Judgment", "Product", "Query", "generate_catalog"]
