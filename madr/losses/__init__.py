"""Loss functions of the papers, one per module (000 MADRAL, 001 MURAL, 002 hybrid, 004 multi-task).

| loss | equation | use |
|---|---|---|
| `MLMLoss` (+ `mask_tokens`) | 001 Eq. 8 | pretraining, both papers |
| `AspectPredictionLoss` | 000 Eq. 3 | aspect learning with a linear value classifier (MADRAL, MtBERT) |
| `AspectPresenceLoss` | 000 Eq. 6 | with the Presence Weighting fusion |
| `GroupWiseContrastiveLoss` (+ `combine_objectives`) | 001 Eq. 2 (Eq. 3-5) | MURAL aspect tokens |
| `InBatchSoftmaxLoss` | 000 L_SCE, 001 Eq. 10 | fine-tuning with in-batch (+ hard) negatives |
| `PointwiseCELoss` | 000 L_CE | fine-tuning on judged pairs, graded targets |
| `FlopsLoss` (+ `FlopsWeightSchedule`) | 002 Eq. 4-5 | sparsity of the hybrid head's lexical vectors |
| `HybridLoss` | 002 Eq. 3-5 | the hybrid model: dense + sparse in-batch softmax + FLOPS (every training path) |
| `TripletLoss` | 004 Eq. 3-7 | click pairs: batch-all / hard / semi-hard / random negatives, L1 / L2 / cosine |
| `NLICosineLoss` (+ `nli_targets`) | 004 Eq. 2 | NLI pairs without contradictions, cross entropy on the cosine |
| `TranslationLoss` | 004 Sec. III-A | parallel sentences (bridge task): in-batch softmax or MSE to English |
| `DistillationMSELoss` | 004 Sec. IV | 3-layer query student to the teacher's outputs |
| `DistillationCosineLoss` | 004 Sec. V-A on the cosine score | cosine to the teacher (+ in-batch score KL) |
"""

from madr.losses.aspect_prediction import AspectPredictionLoss, masked_mean, multi_label_nll
from madr.losses.aspect_presence import AspectPresenceLoss
from madr.losses.distillation import DistillationMSELoss
from madr.losses.distillation_cosine import DistillationCosineLoss
from madr.losses.flops import FlopsLoss, FlopsWeightSchedule
from madr.losses.group_contrastive import GroupWiseContrastiveLoss, combine_objectives
from madr.losses.hybrid import HybridLoss
from madr.losses.in_batch_softmax import InBatchSoftmaxLoss
from madr.losses.mlm import MLMLoss, mask_tokens
from madr.losses.nli_cosine import NLICosineLoss, NLITargets, nli_targets
from madr.losses.pointwise_ce import PointwiseCELoss
from madr.losses.translation import TranslationLoss
from madr.losses.triplet import TripletLoss, distance_matrix, pairwise_distance

__all__ = [
    "DistillationCosineLoss",
    "DistillationMSELoss",
    "NLICosineLoss",
    "NLITargets",
    "TranslationLoss",
    "TripletLoss",
    "distance_matrix",
    "nli_targets",
    "pairwise_distance",
    "AspectPredictionLoss",
    "AspectPresenceLoss",
    "FlopsLoss",
    "FlopsWeightSchedule",
    "GroupWiseContrastiveLoss",
    "HybridLoss",
    "InBatchSoftmaxLoss",
    "MLMLoss",
    "PointwiseCELoss",
    "combine_objectives",
    "mask_tokens",
    "masked_mean",
    "multi_label_nll",
]
