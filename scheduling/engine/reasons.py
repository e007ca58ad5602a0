"""Machine-readable codes for why a pending job is not running (DESIGN.md §6)."""

from typing import Final

QUEUE_CLOSED: Final = "QUEUE_CLOSED"
HELD: Final = "HELD"
NO_MATCHING_NODES: Final = "NO_MATCHING_NODES"
EXCEEDS_QUOTA_LIMIT: Final = "EXCEEDS_QUOTA_LIMIT"
WAITING_FOR_QUOTA: Final = "WAITING_FOR_QUOTA"
WAITING_FOR_GPUS: Final = "WAITING_FOR_GPUS"
WAITING_FOR_PREEMPTION: Final = "WAITING_FOR_PREEMPTION"
RESERVED_FOR_HIGHER_PRIORITY: Final = "RESERVED_FOR_HIGHER_PRIORITY"
BLOCKED_BY_QUEUE_HEAD: Final = "BLOCKED_BY_QUEUE_HEAD"
# A job of several nodes that would start now spread over topology blocks, waiting for
# one block that can hold it within its topology wait.
WAITING_FOR_TOPOLOGY: Final = "WAITING_FOR_TOPOLOGY"

ALL: Final = (
    QUEUE_CLOSED,
    HELD,
    NO_MATCHING_NODES,
    EXCEEDS_QUOTA_LIMIT,
    WAITING_FOR_QUOTA,
    WAITING_FOR_GPUS,
    WAITING_FOR_PREEMPTION,
    RESERVED_FOR_HIGHER_PRIORITY,
    BLOCKED_BY_QUEUE_HEAD,
    WAITING_FOR_TOPOLOGY,
)

# Codes of jobs that cannot start whatever happens to the other jobs: they get no
# estimated start and never block a strict-FIFO queue.
NEVER_STARTS: Final = frozenset({QUEUE_CLOSED, HELD, NO_MATCHING_NODES, EXCEEDS_QUOTA_LIMIT})

# Preemption reasons (Preemption.reason).
PREEMPT_PRIORITY: Final = "priority"
PREEMPT_RECLAIM: Final = "reclaim"
PREEMPT_TIME_SHARING: Final = "time_sharing"
