"""Aspect value vocabularies at phrase / word / token granularity (paper 001 Sec. 5.3.1)."""

from madr.aspects.vocabulary import (
    GRANULARITIES,
    AspectVocabularies,
    AspectVocabulary,
    build_vocabularies,
    normalize_value,
    split_words,
    value_pieces,
)

__all__ = [
    "GRANULARITIES",
    "AspectVocabularies",
    "AspectVocabulary",
    "build_vocabularies",
    "normalize_value",
    "split_words",
    "value_pieces",
]
