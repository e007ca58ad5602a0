"""The Kubernetes executor: a placed job's node becomes one Pod, bound to that node.

State comes from a watch of the pool's Pods (a thread that only queues what it sees;
every decision is taken in :meth:`KubernetesExecutor.poll`, on the runtime's thread).
The Pods that exist with Sluice's owner labels are the executor's truth: a repeated
launch finds its Pod by name (one name per job, attempt and node), and a Pod of a job
Sluice no longer runs shows in :meth:`running` so the control side stops it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from scheduling.agent.protocol import (
    DEFAULT_LOG_CAP_BYTES,
    LAUNCH_FAILED,
    LOG_CHUNK_BYTES,
    LOG_INTERVAL_SECONDS,
    NOT_RUNNING_MESSAGE,
    STOP_LOST,
    STOP_TIMED_OUT,
    SUPERSEDED,
    log_truncated_marker,
)
from scheduling.executors.base import (
    KUBERNETES,
    Capabilities,
    Event,
    Executor,
    Exited,
    GpuSample,
    LogChunk,
    NodeInfo,
    Running,
    Started,
)
from scheduling.executors.kubernetes import dcgm
from scheduling.executors.kubernetes.pods import (
    ANNOTATION_GPU_INDICES,
    ANNOTATION_LOG_CAP,
    CONTAINER,
    MANAGED_BY,
    MANAGED_BY_VALUE,
    PodSettings,
    PodSpecError,
    build_pod,
    namespace_body,
    namespace_name,
    pod_key,
    pod_name,
    pool_selector,
)

logger = logging.getLogger(__name__)

#: Waiting reasons of a container whose image cannot be had: the job fails its launch.
IMAGE_ERRORS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)
#: Waiting reasons of a container the runtime cannot create (a missing secret, a bad user).
CREATE_ERRORS = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
)
#: Labels of a node passed on at registration (topology and the GPU product), besides
#: every label whose name says ``topology`` (see :func:`passed_on`).
NODE_LABELS = (
    "kubernetes.io/hostname",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "nvidia.com/gpu.product",
    "nvidia.com/gpu.memory",
    # The NVLink domain (multi-node NVLink systems), as NVIDIA's GPU feature discovery
    # sets it: a topology block a pool's topology_label may name.
    "nvidia.com/gpu.clique",
)


def passed_on(name: str) -> bool:
    """Whether a node label is passed on at registration: those of :data:`NODE_LABELS`
    and every topology label (``topology.sluice.io/block``, the cloud providers' and
    ``network.topology.kubernetes.io/...`` ones), which a pool's ``topology_label`` may
    name as the node's block."""
    return name in NODE_LABELS or "topology" in name


GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB, as NVIDIA's GPU feature discovery sets it
#: Seconds of overlap when reading a Pod's log again (the API only offers sinceSeconds).
LOG_OVERLAP_SECONDS = 5
#: Seconds the list of Pods that are not Sluice's is kept between two heartbeats.
OUTSIDE_REFRESH_SECONDS = 5.0
#: Phases of a Pod that holds its node's resources (a bound Pending one reserves them).
HOLDING_PHASES = ("Pending", "Running", "Unknown")
#: Seconds a finished Pod is kept when its exit was never confirmed delivered.
FINISHED_POD_SECONDS = 300.0
#: The Kubernetes API calls this executor makes, as (API group, resource, verb): the RBAC
#: rules of deploy/kubernetes allow exactly these (a test checks both ways).
API_CALLS = (
    ("", "namespaces", "get"),
    ("", "namespaces", "create"),
    ("", "nodes", "list"),
    ("", "pods", "create"),
    ("", "pods", "delete"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "pods/log", "get"),
)


@dataclasses.dataclass
class _Pod:
    """What the executor knows of one Pod of a job's attempt on a node."""

    job_id: int
    attempt: int
    node: str
    namespace: str
    name: str
    log_cap: int = DEFAULT_LOG_CAP_BYTES
    created_at: float = 0.0
    seen: bool = False  # the watch or a list has shown it
    started: bool = False
    exit: Exited | None = None
    ended_at: float = 0.0
    stop_reason: str | None = None
    stop_message: str = ""
    last: Mapping[str, Any] | None = None
    gone: bool = False  # deleted from the API
    log_offset: int = 0
    log_ts: tuple[int, int] | None = None  # (unix seconds, nanoseconds) of the last line read
    log_same: int = 0  # lines read so far with exactly that timestamp
    log_done: bool = False
    next_log: float = 0.0

    @property
    def key(self) -> tuple[int, int, str]:
        return self.job_id, self.attempt, self.node


def _status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get("status") or {}


def _container_status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    for item in _status(pod).get("containerStatuses") or []:
        if item.get("name") == CONTAINER:
            return item
    return {}


def parse_timestamp(text: str) -> tuple[int, int]:
    """An RFC 3339 time with up to nanoseconds as (unix seconds, nanoseconds)."""
    text = text.strip().replace("Z", "+00:00")
    fraction = 0
    if "." in text:
        head, rest = text.split(".", 1)
        digits = "".join(itertools.takewhile(str.isdigit, rest))
        zone = rest[len(digits) :]
        fraction = int((digits + "000000000")[:9])
        text = head + zone
    return int(dt.datetime.fromisoformat(text).timestamp()), fraction


def _utf8_cut(data: bytes, limit: int) -> int:
    """The largest cut at most ``limit`` that does not split a UTF-8 character."""
    if limit >= len(data):
        return len(data)
    cut = limit
    while cut > 0 and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut


class KubernetesExecutor(Executor):
    """Runs a pool's jobs as Pods of a Kubernetes cluster (one Pod per job node)."""

    kind = KUBERNETES

    def __init__(
        self,
        api_client: client.ApiClient,
        settings: PodSettings,
        *,
        node_selector: str = "",
        dcgm_urls: Mapping[str, str] | None = None,
        dcgm_url_template: str = "",
        node_lost_seconds: float = 60.0,
        node_check_seconds: float = 10.0,
        log_interval: float = LOG_INTERVAL_SECONDS,
        watch_timeout_seconds: int = 30,
        clock=time.time,
    ) -> None:
        self.api = api_client
        self.core = client.CoreV1Api(api_client)
        self.settings = settings
        self.node_selector = node_selector
        self.dcgm_urls = dict(dcgm_urls or {})
        self.dcgm_url_template = dcgm_url_template
        self.node_lost_seconds = node_lost_seconds
        self.node_check_seconds = node_check_seconds
        self.log_interval = log_interval
        self.watch_timeout_seconds = watch_timeout_seconds
        self.clock = clock
        self._selector = pool_selector(settings.pool)
        self._pods: dict[tuple[int, int, str], _Pod] = {}
        self._failed_attempts: dict[tuple[int, int], str] = {}
        self._newest_attempt: dict[int, int] = {}
        self._namespaces: set[str] = set()
        self._out: list[Event] = []
        self._watched: queue.Queue = queue.Queue()
        self._stop_watch = threading.Event()
        self._thread: threading.Thread | None = None
        self._nodes_cache: tuple[float, list[Mapping[str, Any]]] | None = None
        self._outside_cache: tuple[float, list[dict[str, Any]]] | None = None
        self._node_trouble: dict[str, float] = {}
        self._next_node_check = 0.0

    # --- what it offers ----------------------------------------------------------------

    def capabilities(self) -> Capabilities:
        has_dcgm = bool(self.dcgm_urls or self.dcgm_url_template)
        notes = [
            "Sluice chooses the node and how many GPUs; the kubelet's device plugin chooses "
            "which of the node's free GPUs the Pod gets (the same count, maybe other indices)",
            "the pids limit is not set per Pod (Kubernetes sets it per node)",
            "a serving job's Pod gets its port and a readiness probe; the bridge does not "
            "scrape its metrics",
        ]
        if not has_dcgm:
            notes.append("no DCGM exporter configured: no GPU utilisation, so no idle reclaim")
        return Capabilities(
            images=True,
            gpu_isolation="the device plugin's GPUs only (the container sees no others)",
            run_as="a non-root user of the image (runAsNonRoot, no privilege escalation, "
            "all capabilities dropped)",
            limits=("cpus", "memory_mb", "runtime"),
            serving=False,
            notes=tuple(notes),
        )

    def _list_nodes(self, *, fresh: bool = False) -> list[Mapping[str, Any]]:
        now = self.clock()
        if not fresh and self._nodes_cache and now - self._nodes_cache[0] < 10.0:
            return self._nodes_cache[1]
        listed = self.core.list_node(label_selector=self.node_selector or None)
        items = self.api.sanitize_for_serialization(listed).get("items") or []
        self._nodes_cache = (now, items)
        return items

    def nodes(self) -> list[NodeInfo]:
        infos = []
        for node in self._list_nodes():
            meta, spec, status = node["metadata"], node.get("spec") or {}, node.get("status") or {}
            if spec.get("unschedulable"):
                # A Pod bound by name passes a cordon by, so a cordoned node is not offered.
                continue
            labels = meta.get("labels") or {}
            try:
                count = int((status.get("allocatable") or {}).get(self.settings.gpu_resource, 0))
            except ValueError:
                count = 0
            try:
                memory = int(labels.get(GPU_MEMORY_LABEL, 0))
            except ValueError:
                memory = 0
            model = labels.get(GPU_PRODUCT_LABEL, "")
            name = meta["name"]
            gpus = [
                {
                    "index": i,
                    # The device plugin's UUIDs are not on the Node object: one per slot.
                    "uuid": f"k8s-{pod_name(0, 0, name)[-8:]}-{name[:50]}-{i}",
                    "model": model,
                    "name": model,
                    "memory_mb": memory,
                }
                for i in range(count)
            ]
            infos.append(
                NodeInfo(
                    name=name,
                    gpus=gpus,
                    labels={k: v for k, v in labels.items() if passed_on(k)},
                )
            )
        return infos

    def heartbeat_fields(self, node: str) -> tuple[dict[str, Any], Callable[[], None] | None]:
        fields, after = super().heartbeat_fields(node)
        fields["outside_jobs"] = self.outside_jobs(node)
        return fields, after

    def outside_jobs(self, node: str | None = None) -> list[dict[str, Any]]:
        """Pods bound to the pool's nodes that are not Sluice's and ask for GPUs: capacity
        in use, "outside Sluice", so the engine places nothing on those GPUs (one entry per
        Pod; what its containers ask, the larger of its init containers' and the sum of its
        containers', as the scheduler counts it). Listed at most every
        ``OUTSIDE_REFRESH_SECONDS`` for all nodes at once; a failed list keeps the last one."""
        now = self.clock()
        if self._outside_cache is None or now - self._outside_cache[0] >= OUTSIDE_REFRESH_SECONDS:
            try:
                listed = self.core.list_pod_for_all_namespaces(
                    field_selector="status.phase!=Succeeded,status.phase!=Failed"
                )
            except (ApiException, OSError, urllib3.exceptions.HTTPError) as exc:
                logger.warning("listing the Pods that are not Sluice's: %s", exc)
            else:
                items = self.api.sanitize_for_serialization(listed).get("items") or []
                self._outside_cache = (now, self._outside_from(items))
        found = self._outside_cache[1] if self._outside_cache else []
        return [dict(item) for item in found if node is None or item["node"] == node]

    def _outside_from(self, pods: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
        ours = {info.name for info in self.nodes()}
        result = []
        for pod in pods:
            meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
            labels = meta.get("labels") or {}
            node = spec.get("nodeName") or ""
            phase = (pod.get("status") or {}).get("phase", "")
            if node not in ours or phase not in HOLDING_PHASES:
                continue
            if labels.get(MANAGED_BY) == MANAGED_BY_VALUE:
                continue  # Sluice's own, of this pool or another
            gpus = self._pod_gpus(spec)
            if gpus <= 0:
                continue
            result.append(
                {
                    "pod": f"{meta.get('namespace', '')}/{meta.get('name', '')}",
                    "node": node,
                    "user": meta.get("namespace", ""),
                    "name": meta.get("name", ""),
                    "gpu_indices": [],
                    "gpus": gpus,
                    "label": "outside Sluice",
                }
            )
        return result

    def _pod_gpus(self, spec: Mapping[str, Any]) -> int:
        def asked(container: Mapping[str, Any]) -> int:
            resources = container.get("resources") or {}
            for kind in ("limits", "requests"):  # an extended resource's are equal
                value = (resources.get(kind) or {}).get(self.settings.gpu_resource)
                if value is not None:
                    try:
                        return int(value)
                    except (TypeError, ValueError):
                        return 0
            return 0

        containers = sum(asked(c) for c in spec.get("containers") or [])
        init = max((asked(c) for c in spec.get("initContainers") or []), default=0)
        return max(containers, init)

    # --- start and the watch -------------------------------------------------------------

    def start(self) -> None:
        """Take over the pool's Pods as they are (a restart launches nothing again), then
        watch them."""
        self._sync(self._list_pods(), self.clock())
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._watch_loop, name="sluice-k8s-watch", daemon=True
            )
            self._thread.start()

    def _list_pods(self) -> dict[str, Any]:
        listed = self.core.list_pod_for_all_namespaces(label_selector=self._selector)
        return self.api.sanitize_for_serialization(listed)

    def _watch_loop(self) -> None:
        version: str | None = None
        while not self._stop_watch.is_set():
            try:
                if version is None:
                    listed_at = self.clock()
                    listed = self._list_pods()
                    self._watched.put(("SYNC", listed.get("items") or [], listed_at))
                    version = (listed.get("metadata") or {}).get("resourceVersion")
                stream = watch.Watch()
                for event in stream.stream(
                    self.core.list_pod_for_all_namespaces,
                    label_selector=self._selector,
                    resource_version=version,
                    timeout_seconds=self.watch_timeout_seconds,
                    allow_watch_bookmarks=True,
                ):
                    if self._stop_watch.is_set():
                        stream.stop()
                        break
                    raw = event.get("raw_object") or {}
                    version = (raw.get("metadata") or {}).get("resourceVersion") or version
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self._watched.put((event["type"], raw, None))
            except ApiException as exc:
                if exc.status == 410:  # too old a version: list again
                    version = None
                else:
                    logger.warning("watching pods: %s", exc)
                    self._stop_watch.wait(1.0)
            except Exception:  # noqa: BLE001 (a network error must not end the watch)
                logger.exception("watching pods")
                version = None
                self._stop_watch.wait(1.0)

    def close(self) -> None:
        self._stop_watch.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    # --- control messages ----------------------------------------------------------------

    def launch(self, node: str, message: Mapping[str, Any]) -> None:
        job_id, attempt = message["job_id"], message["attempt"]
        key = (job_id, attempt, node)
        known = self._pods.get(key)
        if known is not None:
            # A repeated launch: say again what is known, create nothing.
            if known.exit is not None:
                self._out.append(known.exit)
            elif known.started:
                self._out.append(self._started(known))
            return
        if attempt < self._newest_attempt.get(job_id, attempt):
            self._out.append(
                Exited(
                    job_id, attempt, node, None, None, SUPERSEDED, "a newer attempt was launched"
                )
            )
            return
        self._supersede(job_id, attempt)
        failed = self._failed_attempts.get((job_id, attempt))
        if failed is not None:
            self._out.append(Exited(job_id, attempt, node, None, None, LAUNCH_FAILED, failed))
            return
        try:
            body = build_pod(message, node, self.settings)
        except PodSpecError as exc:
            self._fail_gang(job_id, attempt, node, str(exc))
            return
        namespace, name = body.metadata.namespace, body.metadata.name
        pod = _Pod(
            job_id=job_id,
            attempt=attempt,
            node=node,
            namespace=namespace,
            name=name,
            log_cap=message.get("log_cap_bytes") or DEFAULT_LOG_CAP_BYTES,
            created_at=self.clock(),
        )
        try:
            self._ensure_namespace(namespace, message.get("tenant", ""))
            self.core.create_namespaced_pod(namespace, body)
        except ApiException as exc:
            if exc.status != 409:  # 409: it exists already (a launch before a restart)
                self._fail_gang(job_id, attempt, node, f"the pod could not be created: {_why(exc)}")
                return
        self._pods[key] = pod

    def _supersede(self, job_id: int, attempt: int) -> None:
        self._newest_attempt[job_id] = max(attempt, self._newest_attempt.get(job_id, attempt))
        for pod in list(self._pods.values()):
            if pod.job_id == job_id and pod.attempt < attempt and pod.exit is None:
                self._delete(pod, SUPERSEDED, "a newer attempt was launched", grace=None)

    def _ensure_namespace(self, name: str, tenant: str) -> None:
        if name in self._namespaces:
            return
        try:
            self.core.read_namespace(name)
        except ApiException as exc:
            if exc.status != 404:
                raise
            try:
                self.core.create_namespace(namespace_body(name, tenant))
            except ApiException as created:
                if created.status != 409:
                    raise
        self._namespaces.add(name)

    def _fail_gang(self, job_id: int, attempt: int, node: str, why: str) -> None:
        """All or nothing: one Pod of a job's attempt that cannot be created fails the
        attempt on every node (its Pods made so far are deleted, later ones refused)."""
        self._failed_attempts[(job_id, attempt)] = why
        self._out.append(Exited(job_id, attempt, node, None, None, LAUNCH_FAILED, why))
        for pod in list(self._pods.values()):
            if (pod.job_id, pod.attempt) == (job_id, attempt) and pod.exit is None:
                self._delete(
                    pod,
                    LAUNCH_FAILED,
                    f"the job's pod on {node} could not be created, so none runs: {why}",
                    grace=0,
                )

    def stop(self, node: str, message: Mapping[str, Any]) -> None:
        key = (message["job_id"], message["attempt"], node)
        pod = self._pods.get(key)
        if pod is None:
            self._out.append(
                Exited(*key, None, None, message["reason"], NOT_RUNNING_MESSAGE)  # type: ignore[misc]
            )
            return
        if pod.exit is not None:
            self._out.append(pod.exit)
            return
        if pod.stop_reason is None:
            self._delete(pod, message["reason"], "", grace=int(round(message["grace_seconds"])))

    def _delete(self, pod: _Pod, reason: str, message: str, *, grace: int | None) -> None:
        """Delete a Pod (the kubelet sends SIGTERM, then SIGKILL after ``grace``); its end
        is reported with ``reason`` once the watch shows it."""
        pod.stop_reason, pod.stop_message = reason, message
        try:
            self.core.delete_namespaced_pod(pod.name, pod.namespace, grace_period_seconds=grace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            pod.gone = True
            self._end(pod, *self._last_exit(pod), reason, message)

    # --- what happened ----------------------------------------------------------------

    def poll(self) -> Iterable[Event]:
        now = self.clock()
        while True:
            try:
                kind, obj, listed_at = self._watched.get_nowait()
            except queue.Empty:
                break
            if kind == "SYNC":
                self._sync({"items": obj}, listed_at)
            else:
                self._observe(obj, deleted=kind == "DELETED")
        if now >= self._next_node_check:
            self._next_node_check = now + self.node_check_seconds
            self._check_nodes(now)
        for pod in list(self._pods.values()):
            if pod.exit is None and pod.started and not pod.log_done and now >= pod.next_log:
                pod.next_log = now + self.log_interval
                self._read_log(pod)
            if pod.exit is not None and now - pod.ended_at > FINISHED_POD_SECONDS:
                self._forget(pod)
        out, self._out = self._out, []
        return out

    def _sync(self, listed: Mapping[str, Any], listed_at: float) -> None:
        seen = set()
        for obj in listed.get("items") or []:
            key = pod_key(obj)
            if key is not None:
                seen.add(key)
                self._observe(obj, deleted=False)
        for pod in list(self._pods.values()):
            # Gone while nobody watched: a Pod made before this list that it lacks.
            if pod.key not in seen and pod.exit is None and pod.created_at < listed_at:
                self._observe(dict(pod.last or {}), deleted=True, pod=pod)

    def _observe(self, obj: Mapping[str, Any], *, deleted: bool, pod: _Pod | None = None) -> None:
        if pod is None:
            key = pod_key(obj)
            if key is None:
                return
            pod = self._pods.get(key)
            if pod is None:
                if deleted:
                    return
                pod = self._adopt(obj, key)
        if obj:
            pod.last, pod.seen = obj, True
        if deleted:
            pod.gone = True
        if pod.exit is not None:
            if pod.gone:
                self._pods.pop(pod.key, None)
            return
        if deleted:
            self._end_deleted(pod)
            return
        self._evaluate(pod, obj)

    def _adopt(self, obj: Mapping[str, Any], key: tuple[int, int, str]) -> _Pod:
        meta = obj.get("metadata") or {}
        try:
            cap = int((meta.get("annotations") or {}).get(ANNOTATION_LOG_CAP, ""))
        except ValueError:
            cap = DEFAULT_LOG_CAP_BYTES
        pod = _Pod(
            job_id=key[0],
            attempt=key[1],
            node=key[2],
            namespace=meta.get("namespace", ""),
            name=meta.get("name", ""),
            log_cap=cap,
            created_at=self.clock(),
            # Its start was reported before the restart; only its end is news.
            started=_status(obj).get("phase") in ("Running", "Succeeded", "Failed"),
        )
        self._pods[key] = pod
        self._newest_attempt[key[0]] = max(key[1], self._newest_attempt.get(key[0], key[1]))
        return pod

    def _evaluate(self, pod: _Pod, obj: Mapping[str, Any]) -> None:
        status = _status(obj)
        phase, reason = status.get("phase", ""), status.get("reason", "")
        container = _container_status(obj)
        waiting = (container.get("state") or {}).get("waiting") or {}
        running = (container.get("state") or {}).get("running")
        if waiting.get("reason") in IMAGE_ERRORS:
            image = container.get("image") or _spec_image(obj)
            self._fail_pod(
                pod,
                f"the image {image!r} could not be pulled ({waiting['reason']}): "
                f"{waiting.get('message', '')}".rstrip(": "),
            )
            return
        if waiting.get("reason") in CREATE_ERRORS:
            self._fail_pod(
                pod,
                f"the container could not be created ({waiting['reason']}): "
                f"{waiting.get('message', '')}".rstrip(": "),
            )
            return
        if phase == "Unknown" or reason == "NodeLost":
            self._lose(pod, f"node {pod.node} lost: the pod's state is unknown")
            return
        if not pod.started and (phase == "Running" or running):
            pod.started = True
            self._out.append(self._started(pod))
        if phase not in ("Succeeded", "Failed"):
            return
        code, sig = self._last_exit(pod)
        terminated = _terminated(container)
        if pod.stop_reason:
            self._end(pod, code, sig, pod.stop_reason, pod.stop_message)
        elif reason == "DeadlineExceeded":
            self._end(pod, code, sig, STOP_TIMED_OUT, "the pod passed its activeDeadlineSeconds")
        elif reason == "Evicted":
            self._end(
                pod, code, sig, STOP_LOST, f"evicted by the kubelet: {status.get('message', '')}"
            )
        elif not terminated:
            # Refused by the kubelet's admission (no free GPU, a node selector): never ran.
            self._fail_pod(
                pod, f"the kubelet refused the pod ({reason or phase}): {status.get('message', '')}"
            )
        elif terminated.get("reason") == "OOMKilled":
            self._end(pod, code, sig, "", "killed for using more memory than its limit (OOMKilled)")
        else:
            self._end(pod, code, sig, "", terminated.get("message", "") or "")

    def _started(self, pod: _Pod) -> Started:
        return Started(pod.job_id, pod.attempt, pod.node, None, f"{pod.namespace}/{pod.name}")

    def _last_exit(self, pod: _Pod) -> tuple[int | None, int | None]:
        terminated = _terminated(_container_status(pod.last or {}))
        if not terminated:
            return None, None
        code = terminated.get("exitCode")
        sig = terminated.get("signal") or (code - 128 if code and code > 128 else None)
        return code, sig

    def _fail_pod(self, pod: _Pod, message: str) -> None:
        """A Pod that will never run its command: the launch failed; its Pod goes."""
        self._end(pod, None, None, LAUNCH_FAILED, message)
        self._remove(pod)

    def _lose(self, pod: _Pod, message: str) -> None:
        self._end(pod, None, None, STOP_LOST, message)
        self._remove(pod)

    def _end_deleted(self, pod: _Pod) -> None:
        code, sig = self._last_exit(pod)
        if pod.stop_reason:
            self._end(pod, code, sig, pod.stop_reason, pod.stop_message)
            return
        trouble = self._node_problem(pod.node, fresh=True)
        if trouble:
            self._end(pod, code, sig, STOP_LOST, f"node {pod.node} lost: {trouble}")
            return
        self._end(
            pod,
            code,
            sig,
            "",
            f"the pod {pod.namespace}/{pod.name} was deleted outside Sluice "
            "(by a person or a controller of the cluster)",
        )

    def _end(self, pod: _Pod, code, sig, reason: str, message: str) -> None:
        if pod.exit is not None:
            return
        if pod.started and not pod.gone:
            self._read_log(pod)  # all the output there is, before the exit
        pod.exit = Exited(pod.job_id, pod.attempt, pod.node, code, sig, reason, message)
        pod.ended_at = self.clock()
        self._out.append(pod.exit)

    def _remove(self, pod: _Pod) -> None:
        if pod.gone:
            return
        try:
            self.core.delete_namespaced_pod(pod.name, pod.namespace, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                logger.warning("deleting pod %s/%s: %s", pod.namespace, pod.name, exc)
                return
        pod.gone = True

    def _forget(self, pod: _Pod) -> None:
        self._remove(pod)
        if pod.gone:
            self._pods.pop(pod.key, None)

    def delivered(self, event: Event) -> None:
        """A delivered exit is reported for good: the finished Pod can go."""
        if isinstance(event, Exited):
            pod = self._pods.get((event.job_id, event.attempt, event.node))
            if pod is not None and pod.exit is not None:
                self._forget(pod)

    # --- nodes lost -----------------------------------------------------------------------

    def _node_problem(self, node: str, *, fresh: bool = False) -> str:
        """Why ``node`` cannot run Pods now ("" when it can)."""
        try:
            nodes = {n["metadata"]["name"]: n for n in self._list_nodes(fresh=fresh)}
        except ApiException as exc:
            logger.warning("listing nodes: %s", exc)
            return ""
        found = nodes.get(node)
        if found is None:
            return "the node is gone from the cluster"
        for condition in (found.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "Ready" and condition.get("status") != "True":
                return f"the node is not ready ({condition.get('reason') or condition['status']})"
        return ""

    def _check_nodes(self, now: float) -> None:
        active = {pod.node for pod in self._pods.values() if pod.exit is None}
        if not active:
            return
        self._nodes_cache = None
        for node in active:
            trouble = self._node_problem(node)
            if not trouble:
                self._node_trouble.pop(node, None)
                continue
            since = self._node_trouble.setdefault(node, now)
            if "gone" in trouble or now - since >= self.node_lost_seconds:
                for pod in list(self._pods.values()):
                    if pod.node == node and pod.exit is None:
                        pod.gone = pod.gone or "gone" in trouble
                        self._lose(pod, f"node {node} lost: {trouble}")

    # --- output ---------------------------------------------------------------------------

    def _read_log(self, pod: _Pod) -> None:
        """Ship the Pod's new output (whole lines, up to its cap). The log API reads from a
        time, not a byte offset: lines carry their timestamps, and those already shipped
        are skipped."""
        if pod.log_done:
            return
        kwargs: dict[str, Any] = {"timestamps": True}
        if pod.log_ts is not None:
            kwargs["since_seconds"] = max(
                1, int(self.clock() - pod.log_ts[0]) + LOG_OVERLAP_SECONDS
            )
        try:
            text = self.core.read_namespaced_pod_log(
                pod.name, pod.namespace, container=CONTAINER, **kwargs
            )
        except ApiException as exc:
            if exc.status not in (400, 404):  # 400: not started yet; 404: gone
                logger.warning("log of %s/%s: %s", pod.namespace, pod.name, exc)
            return
        new = bytearray()
        start_ts, start_same, at_start = pod.log_ts, pod.log_same, 0
        for line in (text or "").split("\n")[:-1]:
            stamp, _, content = line.partition(" ")
            try:
                ts = parse_timestamp(stamp)
            except ValueError:
                logger.warning("log of %s/%s: a line without a timestamp", pod.namespace, pod.name)
                continue
            if start_ts is not None:
                if ts < start_ts:
                    continue
                if ts == start_ts:
                    at_start += 1
                    if at_start <= start_same:  # shipped by an earlier read
                        continue
            if ts == pod.log_ts:
                pod.log_same += 1
            else:
                pod.log_ts, pod.log_same = ts, 1
            new += (content + "\n").encode()
        self._ship(pod, bytes(new))

    def _ship(self, pod: _Pod, data: bytes) -> None:
        room = pod.log_cap - pod.log_offset
        truncated = len(data) > room
        if truncated:
            data = data[: _utf8_cut(data, room)]
        while data:
            cut = _utf8_cut(data, LOG_CHUNK_BYTES) or len(data[:LOG_CHUNK_BYTES])
            self._out.append(
                LogChunk(pod.job_id, pod.attempt, pod.node, pod.log_offset, data[:cut])
            )
            pod.log_offset += cut
            data = data[cut:]
        if truncated:
            marker = log_truncated_marker(pod.log_cap).encode()
            self._out.append(LogChunk(pod.job_id, pod.attempt, pod.node, pod.log_cap, marker))
            pod.log_done = True

    # --- reconciliation and samples ------------------------------------------------------

    def running(self) -> list[Running]:
        return [
            Running(pod.job_id, pod.attempt, pod.node, f"{pod.namespace}/{pod.name}")
            for pod in self._pods.values()
            if pod.exit is None
        ]

    def _dcgm_url(self, node: str) -> str:
        if node in self.dcgm_urls:
            return self.dcgm_urls[node]
        return self.dcgm_url_template.format(node=node) if self.dcgm_url_template else ""

    def gpu_samples(self) -> list[GpuSample]:
        samples = []
        nodes = {pod.node for pod in self._pods.values()} | set(self.dcgm_urls)
        if self.dcgm_url_template:
            nodes |= {info.name for info in self.nodes()}
        for node in sorted(nodes):
            url = self._dcgm_url(node)
            if not url:
                continue
            try:
                gpus = dcgm.fetch(url)
            except (OSError, ValueError) as exc:
                logger.warning("DCGM exporter of %s (%s): %s", node, url, exc)
                continue
            samples.extend(self._node_samples(node, gpus))
        return samples

    def _node_samples(self, node: str, gpus: list[dcgm.DcgmGpu]) -> list[GpuSample]:
        """The node's samples under the GPU indices Sluice chose: a GPU the exporter says a
        Pod of Sluice's holds is reported as that job's GPU (the device plugin may have
        given it another index)."""
        chosen: dict[tuple[str, str], list[int]] = {}
        for pod in self._pods.values():
            if pod.node == node and pod.exit is None and pod.last:
                raw = ((pod.last.get("metadata") or {}).get("annotations") or {}).get(
                    ANNOTATION_GPU_INDICES, ""
                )
                chosen[(pod.namespace, pod.name)] = [int(i) for i in raw.split(",") if i]
        samples: dict[int, GpuSample] = {}
        unattributed = []
        for gpu in gpus:
            indices = chosen.get((gpu.namespace, gpu.pod))
            if gpu.pod and indices:
                index = indices.pop(0)
                samples[index] = GpuSample(node, index, gpu.utilization, gpu.memory_used_mb)
            else:
                unattributed.append(gpu)
        for gpu in unattributed:
            if gpu.index not in samples:
                samples[gpu.index] = GpuSample(node, gpu.index, gpu.utilization, gpu.memory_used_mb)
        return [samples[i] for i in sorted(samples)]


def _terminated(container: Mapping[str, Any]) -> Mapping[str, Any]:
    state = container.get("state") or {}
    return state.get("terminated") or (container.get("lastState") or {}).get("terminated") or {}


def _spec_image(pod: Mapping[str, Any]) -> str:
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") == CONTAINER:
            return container.get("image", "")
    return ""


def _why(exc: ApiException) -> str:
    """An API error in words: the Status message the API server sent, else the reason."""
    import json

    try:
        body = json.loads(exc.body or "{}")
    except ValueError:
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return f"{exc.status} {message or exc.reason}"


__all__ = ["API_CALLS", "KubernetesExecutor", "PodSettings", "namespace_name"]
