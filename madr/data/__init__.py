"""Catalog data: the parquet schema shared by real and synthetic data, and the synthetic generator."""

from madr.data.schema import ESCI_LABELS, SPLITS, Catalog, Judgment, Product, Query
from madr.data.synthetic.catalog import generate_catalog

__all__ = ["ESCI_LABELS", "SPLITS", "Catalog", "Judgment", "Product", "Query", "generate_catalog"]
