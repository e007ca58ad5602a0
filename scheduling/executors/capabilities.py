"""What each kind of executor can run and enforce before one of its kind has said so
itself: the nodes page and the pool API show these for a pool whose executor has not
registered yet, and job submission checks images against them.

An executor's own :meth:`~scheduling.executors.base.Executor.capabilities` may say more
(the agent reports which cgroup controllers its node has). Pure standard library.
"""

from __future__ import annotations

from dataclasses import replace

from scheduling.executors.base import AGENT, KUBERNETES, SLURM, Capabilities

STATIC_CAPABILITIES: dict[str, Capabilities] = {
    AGENT: Capabilities(
        images=False,
        gpu_isolation="CUDA_VISIBLE_DEVICES only; GPU devices are not isolated",
        run_as="the job's Unix account (when the agent runs as root)",
        limits=("cpus", "memory_mb", "pids", "runtime"),
        serving=True,
        notes=(
            "jobs run as bare host processes: container images cannot run here",
            "cpus, memory and pids are enforced where the node has cgroup v2",
        ),
    ),
    SLURM: Capabilities(
        images=False,  # True where the pool says pyxis/enroot is installed
        gpu_isolation="Slurm's gres (cgroup device constraint where the site configures it)",
        run_as="the tenant's Unix account, as Slurm runs it",
        limits=("cpus", "memory_mb", "runtime"),
        serving=False,
        notes=(
            "container images run only where the site has pyxis/enroot (--container-image)",
            "utilisation comes from an observe-only sampler on each node",
        ),
    ),
    KUBERNETES: Capabilities(
        images=True,
        gpu_isolation="the device plugin's nvidia.com/gpu resource",
        run_as="the image's user, in the tenant's namespace",
        limits=("cpus", "memory_mb", "runtime"),
        serving=True,
        notes=("utilisation comes from a DCGM exporter per node where present",),
    ),
}


def static_capabilities(kind: str, *, container_runtime: str = "") -> Capabilities:
    """The capabilities of an executor kind; a Slurm pool with a container runtime
    (``pyxis``) runs images."""
    caps = STATIC_CAPABILITIES[kind]
    if kind == SLURM and container_runtime:
        caps = replace(caps, images=True)
    return caps


def can_run_images(kind: str, *, container_runtime: str = "") -> bool:
    """Whether a pool run by ``kind`` (with ``container_runtime``, for Slurm) runs images."""
    return static_capabilities(kind, container_runtime=container_runtime).images
