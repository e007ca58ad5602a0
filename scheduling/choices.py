"""Names of states and kinds, in the words of DESIGN.md."""

from django.db import models


class PoolPurpose(models.TextChoices):
    TRAINING = "training", "Training"
    INFERENCE = "inference", "Inference"
    INTERACTIVE = "interactive", "Interactive"
    GENERAL = "general", "General"


class ExecutorKind(models.TextChoices):
    """What runs a pool's jobs (scheduling.executors)."""

    AGENT = "agent", "Node agent"
    SLURM = "slurm", "Slurm"
    KUBERNETES = "kubernetes", "Kubernetes"


class ContainerRuntime(models.TextChoices):
    """How a Slurm pool's nodes run container images ("": they do not)."""

    NONE = "", "None"
    PYXIS = "pyxis", "pyxis/enroot"


class ImagePullPolicy(models.TextChoices):
    ALWAYS = "Always", "Always"
    IF_NOT_PRESENT = "IfNotPresent", "IfNotPresent"
    NEVER = "Never", "Never"


class NodeState(models.TextChoices):
    READY = "ready", "Ready"
    DRAINING = "draining", "Draining"
    CORDONED = "cordoned", "Cordoned"
    DOWN = "down", "Down"


class GpuHealth(models.TextChoices):
    HEALTHY = "healthy", "Healthy"
    UNHEALTHY = "unhealthy", "Unhealthy"


class Environment(models.TextChoices):
    PRODUCTION = "production", "Production"
    STAGING = "staging", "Staging"
    EXPERIMENT = "experiment", "Experiment"


class QueueState(models.TextChoices):
    OPEN = "open", "Open"
    CLOSED = "closed", "Closed"
    DRAINING = "draining", "Draining"


class WorkloadType(models.TextChoices):
    TRAINING = "training", "Training"
    FINE_TUNING = "fine_tuning", "Fine-tuning"
    EVALUATION = "evaluation", "Evaluation"
    INFERENCE = "inference", "Online inference"
    BATCH_INFERENCE = "batch_inference", "Batch inference"
    INTERACTIVE = "interactive", "Interactive session"


class JobState(models.TextChoices):
    PENDING = "PENDING", "Pending"
    HELD = "HELD", "Held"
    ADMITTED = "ADMITTED", "Admitted"
    RUNNING = "RUNNING", "Running"
    STOPPING = "STOPPING", "Stopping"
    SUCCEEDED = "SUCCEEDED", "Succeeded"
    FAILED = "FAILED", "Failed"
    CANCELLED = "CANCELLED", "Cancelled"
    TIMED_OUT = "TIMED_OUT", "Timed out"
    RECLAIMED = "RECLAIMED", "Reclaimed"
    PREEMPTED = "PREEMPTED", "Preempted"
    LOST = "LOST", "Lost"


ACTIVE_STATES = (JobState.ADMITTED, JobState.RUNNING, JobState.STOPPING)
WAITING_STATES = (JobState.PENDING, JobState.HELD)
FINAL_STATES = (
    JobState.SUCCEEDED,
    JobState.FAILED,
    JobState.CANCELLED,
    JobState.TIMED_OUT,
    JobState.RECLAIMED,
)


class StopReason(models.TextChoices):
    CANCELLED = "cancelled", "Cancelled"
    PREEMPTED = "preempted", "Preempted"
    TIMED_OUT = "timed_out", "Timed out"
    RECLAIMED = "reclaimed", "Reclaimed (idle)"
    LOST = "lost", "Node lost"


# The end state a stop leads to, once the process has exited.
STOP_REASON_END_STATE = {
    StopReason.CANCELLED: JobState.CANCELLED,
    StopReason.PREEMPTED: JobState.PREEMPTED,
    StopReason.TIMED_OUT: JobState.TIMED_OUT,
    StopReason.RECLAIMED: JobState.RECLAIMED,
    StopReason.LOST: JobState.LOST,
}

# Workload types that count as "inference" for the never-preempt-inference-by-training rule.
INFERENCE_TYPES = (WorkloadType.INFERENCE,)
TRAINING_TYPES = (WorkloadType.TRAINING, WorkloadType.FINE_TUNING)
#: A workload policy's idle utilization threshold (%) unless it sets another; the one read for
#: a workload type that has no policy.
DEFAULT_IDLE_THRESHOLD = 5.0


class RaiseState(models.TextChoices):
    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    EXPIRED = "expired", "Expired"
    REVOKED = "revoked", "Revoked"
    CANCELLED = "cancelled", "Cancelled"


# States in which a job may be raised, and in which a granted class still matters to it.
RAISABLE_STATES = (JobState.PENDING, JobState.HELD, JobState.ADMITTED, JobState.RUNNING)
LIVE_STATES = (*RAISABLE_STATES, JobState.STOPPING, JobState.PREEMPTED, JobState.LOST)


class NotificationKind(models.TextChoices):
    RAISE_REQUESTED = "raise_requested", "Raise requested"
    RAISE_APPROVED = "raise_approved", "Raise approved"
    RAISE_REJECTED = "raise_rejected", "Raise rejected"
    RAISE_EXPIRED = "raise_expired", "Raise expired"
    RAISE_REVOKED = "raise_revoked", "Raise revoked"
    RUNTIME_WARNING = "runtime_warning", "Runtime limit near"
    JOB_TIMED_OUT = "job_timed_out", "Job timed out"
    IDLE_WARNING = "idle_warning", "Session idle"
    JOB_RECLAIMED = "job_reclaimed", "Job reclaimed"
    JOB_REQUEUED = "job_requeued", "Job requeued"
    IDLE_EXEMPTED = "idle_exempted", "Idle reclaim exemption"
    EXTENSION_REQUESTED = "extension_requested", "Runtime extension requested"
    EXTENSION_APPROVED = "extension_approved", "Runtime extension approved"
    EXTENSION_REJECTED = "extension_rejected", "Runtime extension rejected"
    RECOMMENDATION = "recommendation", "Recommendation"
    POLICY_REVIEW = "policy_review", "Weekly policy review"


class ExtensionState(models.TextChoices):
    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    AUTO_GRANTED = "auto_granted", "Granted (within the policy's cap)"


# Extensions that added to a job's runtime limit.
GRANTED_EXTENSION_STATES = (ExtensionState.APPROVED, ExtensionState.AUTO_GRANTED)


class ReclaimKind(models.TextChoices):
    """Why GPUs were taken back (a ``ReclaimRecord``)."""

    TIMEOUT = "timeout", "Runtime limit"
    IDLE_RECLAIM = "idle_reclaim", "Idle reclaim"
    SESSION_AGE = "session_age", "Session maximum age"
    STUCK_LAUNCH = "stuck_launch", "Stuck launch requeued"
    LOST_REQUEUE = "lost_requeue", "Lost node requeue"
    PREEMPTION_REQUEUE = "preemption_requeue", "Preemption requeue"
    ZOMBIE_KILL = "zombie_kill", "Zombie process killed"


class SimulationState(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"
