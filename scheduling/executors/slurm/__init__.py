"""Slurm pools: Sluice decides, a Slurm controller runs (see docs/operator/executor-slurm.md)."""

from scheduling.executors.slurm.client import SlurmClient, SlurmError
from scheduling.executors.slurm.executor import SlurmExecutor

__all__ = ["SlurmClient", "SlurmError", "SlurmExecutor"]
