"""The scheduling algorithm as pure Python: a snapshot in, a plan out (DESIGN.md §6).

No Django and nothing else of the project is imported here, so the dispatch loop, the
benchmarks and the simulator can all run the very same code.
"""

from .native import guard

guard()  # before any compiled module is imported: never a stale build (see .native)

from . import reasons  # noqa: E402
from .cluster import KeptCluster  # noqa: E402
from .plan import PendingInfo, Placement, Plan, Preemption, plan  # noqa: E402
from .quota import promotions  # noqa: E402
from .snapshot import GpuInfo, NodeInfo, PendingJob, QueueInfo, QuotaInfo, RunningJob, Snapshot  # noqa: E402
from .usage import decay_usage  # noqa: E402

__all__ = [
    "GpuInfo",
    "KeptCluster",
    "NodeInfo",
    "PendingInfo",
    "PendingJob",
    "Placement",
    "Plan",
    "Preemption",
    "QueueInfo",
    "QuotaInfo",
    "RunningJob",
    "Snapshot",
    "decay_usage",
    "plan",
    "promotions",
    "reasons",
]
