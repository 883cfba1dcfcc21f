"""The experiment's `distributed:` section as the Ray training job reads it.

The section's keys are defined (and checked when the experiment loads) by `madr.distributed_config.DistributedConfig`;
`distributed_config(cfg)` gives the checked settings of a loaded experiment.
"""

from __future__ import annotations

from madr.config import ExperimentConfig, from_dict
from madr.distributed_config import DistributedConfig

__all__ = ["DistributedConfig", "distributed_config"]


def distributed_config(cfg: ExperimentConfig) -> DistributedConfig:
    """The experiment's `distributed:` section as a checked `DistributedConfig` (defaults for missing keys)."""
    return from_dict(DistributedConfig, cfg.distributed, "distributed.")
