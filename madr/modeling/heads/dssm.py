"""DSSM-style baseline: bag of wordpieces -> MLP (paper 000 Sec. 8.2, after Huang et al. 2013).

Paper 000 feeds BERT wordpiece ids to DSSM and initialises its embedding table from the pretrained
BiBERT; `init_embeddings` does that when given a table, which `madr.modeling.model.BiEncoder` does whenever the DSSM
config's `backbone` names a pretrained encoder (the table is then as wide as that encoder's hidden size).
"""

from __future__ import annotations

import torch
from torch import nn

from madr.modeling.outputs import TowerOutput


class DSSMEncoder(nn.Module):
    def __init__(self, vocab_size: int, embed_dim: int, hidden: list[int], pad_id: int = 0) -> None:
        super().__init__()
        self.pad_id = pad_id
        self.embeddings = nn.EmbeddingBag(vocab_size, embed_dim, mode="mean", padding_idx=pad_id)
        layers: list[nn.Module] = []
        dims = [embed_dim, *hidden]
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
            layers.append(nn.Linear(a, b))
            if i < len(dims) - 2:
                layers.append(nn.Tanh())
        self.mlp = nn.Sequential(*layers)
        self.output_dim = dims[-1]

    def init_embeddings(self, table: torch.Tensor) -> None:
        if table.shape != self.embeddings.weight.shape:
            raise ValueError(f"DSSM embedding init: shape {tuple(table.shape)} != {tuple(self.embeddings.weight.shape)}")
        with torch.no_grad():
            self.embeddings.weight.copy_(table)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> TowerOutput:
        ids = input_ids.masked_fill(attention_mask == 0, self.pad_id)
        return TowerOutput(embedding=self.mlp(self.embeddings(ids)))
