"""Cached teacher targets for distillation (paper 004 Sec. V-A): the frozen teacher runs once per text.

The teacher does not change while a student learns from it, so its output for each distinct training text is
computed once (batched, eval mode, no gradient) and kept; every distillation step then costs the student
only. For the 12-layer e5 teacher and a 3-layer student that removes about 4/5 of each step's forward work
(and each epoch over the texts repeats none of it). The vectors can be saved and loaded (a tensor file read
with `weights_only=True`: nothing is unpickled) so that a resumed or repeated run skips the teacher too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

Tokenize = Callable[[list[str]], dict[str, torch.Tensor]]


class TeacherTargets:
    """`texts[i] -> vectors[i]`: the teacher's output for each distinct text (CPU, float32)."""

    def __init__(self, texts: Sequence[str], vectors: torch.Tensor) -> None:
        if vectors.dim() != 2 or len(texts) != vectors.shape[0]:
            raise ValueError(
                f"TeacherTargets: {len(texts)} texts but vectors of shape {tuple(vectors.shape)}"
            )
        self.texts = list(texts)
        self.vectors = vectors
        self.index = {t: i for i, t in enumerate(self.texts)}
        if len(self.index) != len(self.texts):
            raise ValueError("TeacherTargets: texts must be distinct")

    def __len__(self) -> int:
        return len(self.texts)

    def __contains__(self, text: str) -> bool:
        return text in self.index

    def lookup(self, texts: Sequence[str]) -> torch.Tensor:
        """`[len(texts), d]` teacher vectors; KeyError naming the first text that was never encoded."""
        missing = next((t for t in texts if t not in self.index), None)
        if missing is not None:
            raise KeyError(f"TeacherTargets: no cached teacher output for {missing[:80]!r}")
        return self.vectors[torch.tensor([self.index[t] for t in texts], dtype=torch.long)]

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"texts": self.texts, "vectors": self.vectors}, path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> TeacherTargets:
        state = torch.load(Path(path), weights_only=True)
        return cls(state["texts"], state["vectors"])


@torch.no_grad()
def cache_teacher_targets(
    teacher: nn.Module, texts: Sequence[str], tokenize: Tokenize, batch_size: int = 128
) -> TeacherTargets:
    """Encode each distinct non-empty text of `texts` once with `teacher` (a Tower: `(ids, mask) -> .embedding`)
    in eval mode without gradient, in batches of `batch_size` sorted by length (less padding); the teacher's
    mode is restored. Mean pooling and the attention mask make a text's vector independent of its batch."""
    distinct = list(dict.fromkeys(t for t in texts if t and t.strip()))
    if not distinct:
        raise ValueError("cache_teacher_targets: no non-empty text")
    if batch_size < 1:
        raise ValueError(f"cache_teacher_targets: batch_size must be >= 1, got {batch_size}")
    order = sorted(range(len(distinct)), key=lambda i: len(distinct[i]))
    device = next(teacher.parameters()).device
    was = teacher.training
    teacher.eval()
    chunks = []
    try:
        for start in range(0, len(order), batch_size):
            enc = tokenize([distinct[i] for i in order[start : start + batch_size]])
            out = teacher(enc["input_ids"].to(device), enc["attention_mask"].to(device)).embedding
            chunks.append(out.float().cpu())
    finally:
        teacher.train(was)
    vectors = torch.empty(len(distinct), chunks[0].shape[-1])
    vectors[torch.tensor(order)] = torch.cat(chunks)
    return TeacherTargets(distinct, vectors)
