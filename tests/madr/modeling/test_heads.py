"""Head internals: AEN masking (paper 000 Sec. 4) and MURAL token grouping (paper 001 Sec. 4.3)."""

import torch

from madr.modeling.heads import AspectExtractionNetwork, objective_token_index


def test_aen_gives_cls_and_padding_zero_attention():
    torch.manual_seed(0)
    aen = AspectExtractionNetwork(num_aspects=4, hidden=8)
    seq = torch.randn(2, 5, 8)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    emb, attn = aen(seq, mask)
    assert emb.shape == (2, 4, 8) and attn.shape == (2, 4, 5)
    assert torch.all(attn[:, :, 0] == 0), f"CLS must get zero attention: {attn[:, :, 0]}"
    assert torch.all(attn[1, :, 3:] == 0), "padding must get zero attention"
    assert torch.allclose(attn.sum(-1), torch.ones(2, 4))


def test_aen_matches_equation_1_2_by_hand():
    torch.manual_seed(1)
    aen = AspectExtractionNetwork(num_aspects=2, hidden=4)
    seq = torch.randn(1, 3, 4)
    mask = torch.ones(1, 3, dtype=torch.long)
    emb, _ = aen(seq, mask)
    q = aen.queries @ aen.w_q.weight.T
    k = seq[0] @ aen.w_k.weight.T
    v = seq[0] @ aen.w_v.weight.T
    scores = q @ k.T / 2.0  # sqrt(H) = 2
    scores[:, 0] = float("-inf")  # CLS masked
    expected = torch.softmax(scores, -1) @ v
    assert torch.allclose(emb[0], expected, atol=1e-6)


def test_mural_grouping_token_counts():
    aspects, grans = ["brand", "color"], ["phrase", "word", "token"]
    names, idx = objective_token_index(aspects, grans, "single")
    assert len(names) == 6 and len(set(idx.values())) == 6
    names, idx = objective_token_index(aspects, grans, "granularity")
    assert names == grans and idx["brand/word"] == idx["color/word"] == 1
    names, idx = objective_token_index(aspects, grans, "aspect")
    assert names == aspects and idx["color/phrase"] == idx["color/token"] == 1
