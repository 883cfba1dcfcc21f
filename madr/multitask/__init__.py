"""Multi-task training utilities of paper 004 (Sec. III-B): which task each batch is read from."""

from madr.multitask.schedule import MODES, STOPPING_CONDITIONS, ScheduledBatch, TaskSchedule

__all__ = ["MODES", "STOPPING_CONDITIONS", "ScheduledBatch", "TaskSchedule"]
