"""DeepSpeed's JIT-built ops, built ahead: `python -m pipelines.train.ops`.

On CPU, DeepSpeed's communication backend compiles a shared-memory op (`deepspeed_shm_comm`, its intra-node
all-reduce) with ninja the first time a process initialises it: a long C++ build inside the first
training step of a fresh environment. `deepspeed_env` keeps the build with the environment (under
`sys.prefix`, so every Ray worker of this venv finds it); installing runs this module once
(`scripts/bootstrap.sh`; a cluster image's setup can too), so no training job or test compiles it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def deepspeed_env(use_gpu: bool) -> None:
    """Set (unless already set) the accelerator DeepSpeed should use and where its built ops live."""
    if not use_gpu:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))


def build_deepspeed_ops(use_gpu: bool = False) -> list[str]:
    """Build (or load, when built) the ops a CPU training job JIT-builds; returns their names. None are
    needed on a GPU accelerator (CUDA / ROCm ops come with the DeepSpeed build)."""
    deepspeed_env(use_gpu)
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    built = []
    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None and deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        builder.load(verbose=False)
        built.append(builder.NAME)
    return built


if __name__ == "__main__":
    start = time.perf_counter()
    names = build_deepspeed_ops()
    print(f"DeepSpeed ops ready ({', '.join(names) or 'none needed'}) in {time.perf_counter() - start:.1f} s, "
          f"in {os.environ['TORCH_EXTENSIONS_DIR']}")
