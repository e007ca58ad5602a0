"""What a placed job becomes on Kubernetes: names, labels and the Pod itself.

Pure functions of a validated ``launch`` message and the executor's settings, so the
shape of every Pod Sluice creates can be read and tested in one place.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from collections.abc import Mapping
from typing import Any

from kubernetes import client

from scheduling.agent.protocol import DEFAULT_LOG_CAP_BYTES, is_reserved_env_name

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "sluice"
LABEL_JOB_ID = "sluice.io/job-id"
LABEL_ATTEMPT = "sluice.io/attempt"
LABEL_TENANT = "sluice.io/tenant"
LABEL_POOL = "sluice.io/pool"
#: The node the job was placed on, in full (label values are limited to 63 characters).
ANNOTATION_NODE = "sluice.io/node"
ANNOTATION_GPU_INDICES = "sluice.io/gpu-indices"
ANNOTATION_LOG_CAP = "sluice.io/log-cap-bytes"
CONTAINER = "job"
#: Image pull policies a launch may name (the Kubernetes API's values).
PULL_POLICIES = ("Always", "IfNotPresent", "Never")

_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@dataclasses.dataclass(frozen=True)
class PodSettings:
    """How this site's Pods are made (the bridge's options)."""

    pool: str
    gpu_resource: str = "nvidia.com/gpu"
    namespace_prefix: str = "sluice-"
    #: The namespace of jobs without a tenant.
    default_namespace: str = "sluice-jobs"
    #: The image of a job that names none ("": such a job fails its launch, saying so).
    default_image: str = ""
    #: The uid jobs run as when the image does not set a non-root user (None: the image's).
    run_as_user: int | None = None
    #: The container port of a serving job (also ``PORT`` in its environment).
    serve_port: int = 8000
    #: Seconds past the runtime limit (and grace) before Kubernetes ends a Pod itself.
    deadline_slack_seconds: int = 300


def _short_hash(text: str, length: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def _dns_label(text: str, limit: int) -> str:
    """``text`` as a DNS-1123 label of at most ``limit`` characters: kept as is when it is
    one, else lowered and cleaned with a short hash of the original appended (so two
    tenants whose slugs differ only in case or ``_`` never share a namespace)."""
    if len(text) <= limit and _DNS_LABEL_RE.match(text):
        return text
    cleaned = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    suffix = _short_hash(text, 6)
    return f"{cleaned[: limit - len(suffix) - 1].strip('-')}-{suffix}".lstrip("-")


def namespace_name(tenant: str, settings: PodSettings) -> str:
    """The namespace of a tenant's Pods: ``sluice-<tenant>`` (a valid name in any case)."""
    if not tenant:
        return settings.default_namespace
    prefix = settings.namespace_prefix
    return prefix + _dns_label(tenant, 63 - len(prefix))


def label_value(text: str) -> str:
    """``text`` as a label value (63 characters, alphanumeric at both ends)."""
    if len(text) <= 63 and _LABEL_VALUE_RE.match(text):
        return text
    return _dns_label(text, 63)


def pod_name(job_id: int, attempt: int, node: str) -> str:
    """One name per job attempt and node: creating it twice is refused by the API server
    (409), which is what keeps a repeated ``launch`` from starting a job twice."""
    return f"sluice-{job_id}-{attempt}-{_short_hash(node)}"


def owner_labels(*, job_id: int, attempt: int, tenant: str, pool: str) -> dict[str, str]:
    """The labels that say a Pod is Sluice's, for reconciliation and ``running()``."""
    return {
        MANAGED_BY: MANAGED_BY_VALUE,
        LABEL_POOL: label_value(pool),
        LABEL_JOB_ID: str(job_id),
        LABEL_ATTEMPT: str(attempt),
        LABEL_TENANT: label_value(tenant) if tenant else "",
    }


def pool_selector(pool: str) -> str:
    """The label selector of every Pod of this pool."""
    return f"{MANAGED_BY}={MANAGED_BY_VALUE},{LABEL_POOL}={label_value(pool)}"


def namespace_body(name: str, tenant: str) -> client.V1Namespace:
    """A tenant namespace as Sluice creates it: labelled as Sluice's, and enforcing the
    ``restricted`` Pod Security Standard that every Pod of Sluice's meets."""
    labels = {
        MANAGED_BY: MANAGED_BY_VALUE,
        "pod-security.kubernetes.io/enforce": "restricted",
    }
    if tenant:
        labels[LABEL_TENANT] = label_value(tenant)
    return client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels))


def job_env(message: Mapping[str, Any], node: str, settings: PodSettings) -> dict[str, str]:
    """The job's environment, as the agent gives it, less what a container gets otherwise:
    the device plugin sets the GPUs the container sees (numbered from 0 inside it), and
    ``HOME``/``USER`` come from the image."""
    env = {k: v for k, v in message["env"].items() if not is_reserved_env_name(k)}
    env.update(
        {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "SLUICE_JOB_ID": str(message["job_id"]),
            "SLUICE_ATTEMPT": str(message["attempt"]),
            "SLUICE_JOB_NAME": message["name"],
            "SLUICE_NODE": node,
            "SLUICE_CHECKPOINT_DIR": message["checkpoint_dir"] or "checkpoints",
        }
    )
    if not message["gpu_indices"]:
        # The NVIDIA container runtime shows every GPU to a container that asks for none.
        env["NVIDIA_VISIBLE_DEVICES"] = "none"
    if message["array_index"] is not None:
        env["SLUICE_ARRAY_INDEX"] = str(message["array_index"])
    if message.get("serve"):
        env["PORT"] = env["SLUICE_SERVE_PORT"] = str(settings.serve_port)
    return env


class PodSpecError(ValueError):
    """A launch that cannot become a Pod (the job fails its launch with this message)."""


def job_image(message: Mapping[str, Any], settings: PodSettings) -> str:
    image = message.get("image") or settings.default_image
    if not image:
        raise PodSpecError(
            "this pool runs containers: the job names no image and the pool has no default image"
        )
    return image


def _resources(message: Mapping[str, Any], settings: PodSettings) -> client.V1ResourceRequirements:
    gpus = len(message["gpu_indices"])
    limits: dict[str, str] = {}
    if gpus:
        limits[settings.gpu_resource] = str(gpus)
    job_limits = message.get("limits") or {}
    if job_limits.get("cpus"):
        limits["cpu"] = f"{int(round(job_limits['cpus'] * 1000))}m"
    if job_limits.get("memory_mb"):
        limits["memory"] = f"{int(job_limits['memory_mb'])}Mi"
    # Requests equal to limits: the Pod counts for what it may use (Guaranteed when all set).
    return client.V1ResourceRequirements(limits=limits or None, requests=dict(limits) or None)


def _command(message: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    command = list(message["command"])
    if message["shell"]:
        return ["/bin/sh", "-c"], [command[0], message["name"] or "sluice-job", *command[1:]]
    return command, []


def build_pod(message: Mapping[str, Any], node: str, settings: PodSettings) -> client.V1Pod:
    """The Pod of one node of a placed job (``message`` is a validated ``launch``)."""
    image = job_image(message, settings)
    working_dir = message["working_dir"]
    if working_dir and not working_dir.startswith("/"):
        raise PodSpecError(
            f"working_dir {working_dir!r} must be absolute on a Kubernetes pool "
            "(a Pod has no Sluice workspace to start from)"
        )
    pull_policy = message.get("image_pull_policy") or None
    if pull_policy is not None and pull_policy not in PULL_POLICIES:
        raise PodSpecError(f"image_pull_policy {pull_policy!r} is not one of {PULL_POLICIES}")
    tenant = message.get("tenant", "")
    grace = int(round(message["grace_seconds"]))
    command, args = _command(message)
    serve = message.get("serve") or {}
    container = client.V1Container(
        name=CONTAINER,
        image=image,
        image_pull_policy=pull_policy,
        command=command,
        args=args or None,
        env=[client.V1EnvVar(name=k, value=v) for k, v in job_env(message, node, settings).items()],
        working_dir=working_dir or None,
        resources=_resources(message, settings),
        security_context=client.V1SecurityContext(
            run_as_non_root=True,
            run_as_user=settings.run_as_user,
            allow_privilege_escalation=False,
            privileged=False,
            capabilities=client.V1Capabilities(drop=["ALL"]),
            seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault"),
        ),
    )
    if serve:
        container.ports = [client.V1ContainerPort(name="serve", container_port=settings.serve_port)]
        container.readiness_probe = client.V1Probe(
            http_get=client.V1HTTPGetAction(path=serve["health_path"], port=settings.serve_port),
            period_seconds=5,
            failure_threshold=3,
        )
    deadline = message.get("runtime_limit_seconds")
    pull_secret = message.get("image_pull_secret") or ""
    annotations = {
        ANNOTATION_NODE: node,
        ANNOTATION_GPU_INDICES: ",".join(str(i) for i in message["gpu_indices"]),
        ANNOTATION_LOG_CAP: str(message.get("log_cap_bytes") or DEFAULT_LOG_CAP_BYTES),
    }
    return client.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=client.V1ObjectMeta(
            name=pod_name(message["job_id"], message["attempt"], node),
            namespace=namespace_name(tenant, settings),
            labels=owner_labels(
                job_id=message["job_id"],
                attempt=message["attempt"],
                tenant=tenant,
                pool=settings.pool,
            ),
            annotations=annotations,
        ),
        spec=client.V1PodSpec(
            # Bound by Sluice: the kube-scheduler never sees (or reorders) the Pod.
            node_name=node,
            restart_policy="Never",
            termination_grace_period_seconds=grace,
            # A backstop a grace period (and a slack) after Sluice's own stop at the limit.
            active_deadline_seconds=(
                math.ceil(deadline) + grace + settings.deadline_slack_seconds if deadline else None
            ),
            automount_service_account_token=False,
            enable_service_links=False,
            image_pull_secrets=[client.V1LocalObjectReference(name=pull_secret)]
            if pull_secret
            else None,
            security_context=client.V1PodSecurityContext(
                run_as_non_root=True,
                seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault"),
            ),
            containers=[container],
        ),
    )


def pod_key(pod: Mapping[str, Any]) -> tuple[int, int, str] | None:
    """(job id, attempt, node) of a Pod of Sluice's (a JSON object), or None if it is not."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(MANAGED_BY) != MANAGED_BY_VALUE:
        return None
    try:
        job_id, attempt = int(labels[LABEL_JOB_ID]), int(labels[LABEL_ATTEMPT])
    except (KeyError, ValueError):
        return None
    node = (meta.get("annotations") or {}).get(ANNOTATION_NODE) or (pod.get("spec") or {}).get(
        "nodeName", ""
    )
    return job_id, attempt, node
