"""Triplet loss with in-batch negatives for positive-only click pairs (paper 004 Sec. III-A, Eq. 3-7).

`L = 1/N sum_j [ dist(f(q_j), f(d_j)) - dist(f(q_j), f(d_j^N)) + alpha ]_+`   (Eq. 3)

The negative `d_j^N` of query j is built from the batch's other documents (and optional extra negatives) by
one of four strategies (`negatives=`):

* `"batch_all"` (Eq. 4-5): the negatives inside the margin, `D = {d_k : dist(q_j, d_k) <= dist(q_j, d_j) + alpha}`,
  all easy negatives (farther than the margin) discarded. Eq. 4 averages their *embeddings*,
  `f(d_j^N) = 1/|D| sum_{d_k in D, d_k != d_j} f(d_k)`, and Eq. 3 takes the distance to that centroid
  (`batch_all_average="embedding"`, the default, as written). `batch_all_average="loss"` instead averages
  the hinge over the in-margin negatives (the usual "batch all" of Hermans et al. 2017).
  Normaliser: d_j itself satisfies Eq. 5 (alpha >= 0) and Eq. 4 excludes it from the sum but not from |D|,
  so taken literally the centroid is `sum / (k + 1)` for k in-margin negatives, i.e. shrunk toward the
  origin by k/(k+1). We read that as a typo and divide by k, the number of summed negatives (a true mean,
  `batch_all_normaliser="negatives"`); `batch_all_normaliser="paper"` divides by k + 1 as printed.
* `"hard"` (Eq. 6): the hardest negative, the one closest to the query (`min` over distances; Eq. 6's `min`
  of embeddings is read as the arg-min of the distance, as in FaceNet).
* `"semi_hard"` (Eq. 7): the closest negative that is farther than the positive, `dist(q, d_k) > dist(q, d_j)`.
  Eq. 7 also restricts it to D (within the margin); picking the closest farther negative over all negatives
  gives the same loss (if it lies outside the margin its hinge is 0, exactly as for an empty Eq. 7 set).
  When no negative is farther than the positive, Eq. 7 is undefined: `semi_hard_fallback="farthest"`
  (default, the FaceNet implementation in TensorFlow Addons `triplet_semihard_loss`) takes the farthest
  negative, i.e. the easiest of the hard ones; `"skip"` gives that query zero loss.
* `"random"`: one negative drawn uniformly per query (the paper's random-negative baseline, Sec. VI-F),
  from the `generator` (seed it for reproducibility).

Eq. 3's normaliser N is the number of queries in the batch: a query without a usable negative adds 0.
Per-example `weights` w_j (e.g. the clipped inverse propensities of clicks in a position-biased log; Joachims et
al., WSDM'17) make it the weighted mean `sum_j w_j [...]_+ / sum_j w_j`, which is Eq. 3 when every w_j = 1.
Distances: `"l1"` = sum |x - y| (the paper's best, default), `"l2"` = Euclidean norm (not squared),
`"cosine"` = 1 - cos(x, y).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

DISTANCES = ("l1", "l2", "cosine")
NEGATIVE_MODES = ("batch_all", "hard", "semi_hard", "random")
BATCH_ALL_AVERAGES = ("embedding", "loss")
BATCH_ALL_NORMALISERS = ("negatives", "paper")
SEMI_HARD_FALLBACKS = ("farthest", "skip")


def pairwise_distance(x: torch.Tensor, y: torch.Tensor, distance: str = "l1") -> torch.Tensor:
    """Row-wise distance of matching rows: `x`, `y` `[..., d]` -> `[...]`."""
    if distance == "l1":
        return (x - y).abs().sum(-1)
    if distance == "l2":
        return (x - y).pow(2).sum(-1).clamp_min(1e-24).sqrt()
    if distance == "cosine":
        return 1.0 - F.cosine_similarity(x, y, dim=-1)
    raise ValueError(f"distance {distance!r} is not one of {', '.join(DISTANCES)}")


def distance_matrix(x: torch.Tensor, y: torch.Tensor, distance: str = "l1") -> torch.Tensor:
    """`[B, M]` distance of every row of `x [B, d]` to every row of `y [M, d]`."""
    if distance == "l1":
        return torch.cdist(x, y, p=1.0)
    if distance == "l2":
        return torch.cdist(x, y, p=2.0)
    if distance == "cosine":
        return 1.0 - F.normalize(x, dim=-1) @ F.normalize(y, dim=-1).T
    raise ValueError(f"distance {distance!r} is not one of {', '.join(DISTANCES)}")


def weighted_mean(values: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """`sum_j w_j v_j / sum_j w_j` over a `[B]` vector (the plain mean without weights)."""
    if weights is None:
        return values.mean()
    if weights.shape != values.shape:
        raise ValueError(f"weights {tuple(weights.shape)} must match the batch {tuple(values.shape)}")
    weights = weights.to(values)
    return (weights * values).sum() / weights.sum().clamp_min(1e-12)


def _one_hot(index: torch.Tensor, has_any: torch.Tensor, width: int) -> torch.Tensor:
    """Boolean `[B, width]` mask with True at `index[b]` for the rows where `has_any[b]`."""
    mask = torch.zeros(index.shape[0], width, dtype=torch.bool, device=index.device)
    mask[torch.arange(index.shape[0], device=index.device), index] = True
    return mask & has_any[:, None]


class TripletLoss(nn.Module):
    """Triplet loss of paper 004 Eq. 3 with the negative strategies of Eq. 4-7 (see the module docstring).

    Args:
        distance: "l1" (default, best in the paper), "l2" or "cosine".
        margin: alpha of Eq. 3 and 5, >= 0 (the paper gives no value; it is in units of the distance).
        negatives: "batch_all" (Eq. 4-5), "hard" (Eq. 6), "semi_hard" (Eq. 7) or "random".
        generator: torch.Generator for `negatives="random"` (seeded for reproducible draws).
        batch_all_average: "embedding" (Eq. 4 centroid, default) or "loss" (mean hinge).
        batch_all_normaliser: "negatives" (k in-margin negatives, default) or "paper" (k + 1, Eq. 4 as printed).
        semi_hard_fallback: "farthest" (default) or "skip" when no negative is farther than the positive.

    Inputs of `forward`: queries (anchors) `[B, d]`, positives `[B, d]` (row i is query i's document), and
    optional extra `negatives` `[B, n, d]` (per query) or `[N, d]` (shared by all queries). The candidate
    negatives of query i are the other rows' positives plus the extra negatives. `positive_ids` (`[B]`, ints)
    marks rows whose positive is the same document: those in-batch candidates are not used as negatives.
    `negative_mask` (`[B, n]`, bool) marks which per-query extra negatives exist (padding is False); `weights`
    (`[B]`, >= 0) weigh each query's hinge (module docstring).
    """

    def __init__(self, distance: str = "l1", margin: float = 1.0, negatives: str = "semi_hard",
                 generator: torch.Generator | None = None, batch_all_average: str = "embedding",
                 batch_all_normaliser: str = "negatives", semi_hard_fallback: str = "farthest") -> None:
        super().__init__()
        for name, value, allowed in (("distance", distance, DISTANCES), ("negatives", negatives, NEGATIVE_MODES),
                                     ("batch_all_average", batch_all_average, BATCH_ALL_AVERAGES),
                                     ("batch_all_normaliser", batch_all_normaliser, BATCH_ALL_NORMALISERS),
                                     ("semi_hard_fallback", semi_hard_fallback, SEMI_HARD_FALLBACKS)):
            if value not in allowed:
                raise ValueError(f"{name} {value!r} is not one of {', '.join(allowed)}")
        if margin < 0:
            raise ValueError(f"margin must be >= 0, got {margin}")
        self.distance = distance
        self.margin = float(margin)
        self.negatives = negatives
        self.generator = generator
        self.batch_all_average = batch_all_average
        self.batch_all_normaliser = batch_all_normaliser
        self.semi_hard_fallback = semi_hard_fallback

    @staticmethod
    def select_negatives(dist_ap: torch.Tensor, dist_an: torch.Tensor, mode: str, margin: float,
                         valid: torch.Tensor | None = None, generator: torch.Generator | None = None,
                         semi_hard_fallback: str = "farthest") -> torch.Tensor:
        """Boolean `[B, M]` mask of the negatives each query uses (no gradient; selection only).

        `dist_ap [B]`: query-positive distances; `dist_an [B, M]`: query-candidate distances; `valid [B, M]`:
        which candidates may be negatives (default all). "batch_all" marks every valid candidate with
        `dist_an <= dist_ap + margin` (Eq. 5); the other modes mark at most one per row: "hard" the arg-min
        (Eq. 6), "semi_hard" the arg-min among `dist_an > dist_ap` (Eq. 7, fallback as in the module
        docstring), "random" a uniform draw. A row without valid candidates is all False.
        """
        if mode not in NEGATIVE_MODES:
            raise ValueError(f"negatives mode {mode!r} is not one of {', '.join(NEGATIVE_MODES)}")
        if semi_hard_fallback not in SEMI_HARD_FALLBACKS:
            raise ValueError(f"semi_hard_fallback {semi_hard_fallback!r} is not one of {', '.join(SEMI_HARD_FALLBACKS)}")
        if dist_an.dim() != 2 or dist_ap.shape != dist_an.shape[:1]:
            raise ValueError(f"dist_ap {tuple(dist_ap.shape)} must be [B] and dist_an {tuple(dist_an.shape)} [B, M]")
        dist_ap, dist_an = dist_ap.detach(), dist_an.detach()
        if valid is None:
            valid = torch.ones_like(dist_an, dtype=torch.bool)
        elif valid.shape != dist_an.shape:
            raise ValueError(f"valid {tuple(valid.shape)} must match dist_an {tuple(dist_an.shape)}")
        inf = torch.full_like(dist_an, float("inf"))
        has_any = valid.any(dim=1)
        if mode == "batch_all":
            return valid & (dist_an <= dist_ap[:, None] + margin)
        if mode == "hard":
            return _one_hot(torch.where(valid, dist_an, inf).argmin(dim=1), has_any, dist_an.shape[1])
        if mode == "random":
            weights = valid.float()
            weights[~has_any] = 1.0  # any index; masked out below
            pick = torch.multinomial(weights, 1, generator=generator).squeeze(1)
            return _one_hot(pick, has_any, dist_an.shape[1])
        farther = valid & (dist_an > dist_ap[:, None])
        has_farther = farther.any(dim=1)
        semi = _one_hot(torch.where(farther, dist_an, inf).argmin(dim=1), has_farther, dist_an.shape[1])
        if semi_hard_fallback == "skip":
            return semi
        farthest = _one_hot(torch.where(valid, dist_an, -inf).argmax(dim=1), has_any & ~has_farther,
                            dist_an.shape[1])
        return semi | farthest

    def forward(self, anchors: torch.Tensor, positives: torch.Tensor, negatives: torch.Tensor | None = None,
                positive_ids: torch.Tensor | None = None, negative_mask: torch.Tensor | None = None,
                weights: torch.Tensor | None = None) -> torch.Tensor:
        if anchors.dim() != 2 or anchors.shape != positives.shape or anchors.shape[0] == 0:
            raise ValueError(f"anchors {tuple(anchors.shape)} and positives {tuple(positives.shape)} must both "
                             "be [batch>=1, dim]")
        batch, dim = anchors.shape
        shared, per_query = self._split_negatives(negatives, positives)
        valid = self._in_batch_valid(batch, positive_ids, anchors.device)
        dist_ap = pairwise_distance(anchors, positives, self.distance)
        dist_an = distance_matrix(anchors, torch.cat([positives, shared]), self.distance)
        if per_query is not None:
            dist_an = torch.cat([dist_an, pairwise_distance(anchors[:, None, :], per_query, self.distance)], dim=1)
        extra = valid.new_ones(batch, dist_an.shape[1] - batch)
        if negative_mask is not None:
            if per_query is None or negative_mask.shape != per_query.shape[:2]:
                raise ValueError(f"negative_mask {tuple(negative_mask.shape)} must be [batch, n] of per-query "
                                 "negatives [batch, n, d]")
            extra[:, shared.shape[0]:] = negative_mask.to(device=extra.device, dtype=torch.bool)
        valid = torch.cat([valid, extra], dim=1)
        mask = self.select_negatives(dist_ap, dist_an, self.negatives, self.margin, valid, self.generator,
                                     self.semi_hard_fallback)
        count = mask.sum(dim=1)
        if self.negatives == "batch_all" and self.batch_all_average == "embedding":
            dist_neg = self._centroid_distance(anchors, torch.cat([positives, shared]), per_query, mask, count)
            hinge = F.relu(dist_ap - dist_neg + self.margin)
        else:  # mean hinge over the selected negatives (exactly one for hard / semi_hard / random)
            hinge = (F.relu(dist_ap[:, None] - dist_an + self.margin) * mask).sum(dim=1) / count.clamp_min(1)
        return weighted_mean(hinge * (count > 0), weights)

    def _centroid_distance(self, anchors: torch.Tensor, candidates: torch.Tensor, per_query: torch.Tensor | None,
                           mask: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """Eq. 4: distance from each query to the mean embedding of its selected negatives."""
        flat = candidates.shape[0]
        total = mask[:, :flat].to(anchors.dtype) @ candidates
        if per_query is not None:
            total = total + torch.einsum("bn,bnd->bd", mask[:, flat:].to(anchors.dtype), per_query)
        normaliser = count + 1 if self.batch_all_normaliser == "paper" else count
        centroid = total / normaliser.clamp_min(1)[:, None].to(anchors.dtype)
        return pairwise_distance(anchors, centroid, self.distance)

    @staticmethod
    def _split_negatives(negatives: torch.Tensor | None, positives: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(shared `[N, d]`, per-query `[B, n, d]` or None) from the optional extra negatives."""
        batch, dim = positives.shape
        empty = positives.new_zeros(0, dim)
        if negatives is None:
            return empty, None
        if negatives.dim() == 2 and negatives.shape[1] == dim:
            return negatives, None
        if negatives.dim() == 3 and negatives.shape[0] == batch and negatives.shape[2] == dim:
            return empty, negatives
        raise ValueError(f"negatives must be [batch={batch}, n, {dim}] or [N, {dim}], got {tuple(negatives.shape)}")

    @staticmethod
    def _in_batch_valid(batch: int, positive_ids: torch.Tensor | None, device: torch.device) -> torch.Tensor:
        """`[B, B]`: row j's positive may be query i's negative (not its own, nor the same document)."""
        if positive_ids is None:
            return ~torch.eye(batch, dtype=torch.bool, device=device)
        if positive_ids.shape != (batch,):
            raise ValueError(f"positive_ids must be [batch={batch}], got {tuple(positive_ids.shape)}")
        ids = positive_ids.to(device)
        return ids[:, None] != ids[None, :]
