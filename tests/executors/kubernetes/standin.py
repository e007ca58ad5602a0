"""A local stand-in of the Kubernetes API endpoints the executor uses.

Paths, parameters and answer shapes follow the Kubernetes API reference (core/v1):

- ``GET /api/v1/namespaces/{name}``, ``POST /api/v1/namespaces``
- ``GET /api/v1/nodes`` (``labelSelector``)
- ``POST /api/v1/namespaces/{namespace}/pods``, ``GET|DELETE .../pods/{name}``
  (``gracePeriodSeconds``), ``GET .../pods/{name}/log`` (``container``, ``timestamps``,
  ``sinceSeconds``)
- ``GET /api/v1/pods`` (``labelSelector``; ``watch=true`` streams watch events, one JSON
  object per line, from ``resourceVersion``, for ``timeoutSeconds``)

Errors are ``Status`` objects with the API server's reasons (NotFound, AlreadyExists,
Forbidden, Gone). The kubelet's part (a Pod starting, ending, failing to pull) is played by
the test through the helper methods. Every request is recorded (method, path, query) so a
test can check each call against the RBAC rules of deploy/kubernetes.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


#: The Pod fields a field selector may name (the API server supports these and more).
POD_FIELDS = {
    "spec.nodeName": lambda pod: (pod.get("spec") or {}).get("nodeName", ""),
    "status.phase": lambda pod: (pod.get("status") or {}).get("phase", ""),
    "metadata.namespace": lambda pod: pod["metadata"].get("namespace", ""),
}


def field_matches(selector: str, pod: dict) -> bool:
    """Field selectors on Pods: ``f=v``, ``f==v``, ``f!=v`` joined by commas; a field the
    stand-in does not know is refused (the API server answers 400 for those)."""
    for term in filter(None, (t.strip() for t in (selector or "").split(","))):
        negate = "!=" in term
        field, value = term.replace("!=", "=").replace("==", "=").split("=", 1)
        if field not in POD_FIELDS:
            raise ValueError(f"field label not supported: {field}")
        if (POD_FIELDS[field](pod) == value) == negate:
            return False
    return True


def matches(selector: str, labels: dict) -> bool:
    """Equality-based label selectors: ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``."""
    for term in filter(None, (t.strip() for t in (selector or "").split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k) != v:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class StandIn:
    """The stand-in's state and the kubelet's moves; ``url`` is its address."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.version = 1
        self.namespaces: dict[str, dict] = {}
        self.nodes: dict[str, dict] = {}
        self.pods: dict[tuple[str, str], dict] = {}
        self.logs: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self.events: list[tuple[int, str, dict]] = []
        self.requests: list[tuple[str, str, dict]] = []
        #: Pod creations refused: node name -> (code, reason, message)
        self.refuse_on_node: dict[str, tuple[int, str, str]] = {}
        self.stopping = False
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> StandIn:
        self.thread.start()
        return self

    def close(self) -> None:
        with self.lock:
            self.stopping = True
            self.lock.notify_all()
        self.server.shutdown()
        self.server.server_close()

    # --- state changes (under the lock) ----------------------------------------------

    def _bump(self, obj: dict) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)

    def _emit(self, kind: str, obj: dict) -> None:
        self.events.append((self.version, kind, copy.deepcopy(obj)))
        self.lock.notify_all()

    def add_node(self, name: str, *, gpus: int = 8, labels: dict | None = None) -> None:
        with self.lock:
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "uid": str(uuid.uuid4()),
                    "labels": {"kubernetes.io/hostname": name, **(labels or {})},
                    "creationTimestamp": _now_rfc3339(),
                },
                "spec": {},
                "status": {
                    "allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(gpus)},
                    "capacity": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(gpus)},
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                },
            }
            self._bump(node)
            self.nodes[name] = node

    def remove_node(self, name: str) -> None:
        with self.lock:
            self.nodes.pop(name, None)

    def node_not_ready(self, name: str) -> None:
        with self.lock:
            self.nodes[name]["status"]["conditions"] = [
                {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}
            ]

    def pod(self, namespace: str, name: str) -> dict:
        with self.lock:
            return copy.deepcopy(self.pods[(namespace, name)])

    def _update_pod(self, namespace: str, name: str, status: dict) -> None:
        with self.lock:
            pod = self.pods[(namespace, name)]
            pod["status"].update(status)
            self._bump(pod)
            self._emit("MODIFIED", pod)

    def _container_status(self, namespace: str, name: str, state: dict) -> dict:
        pod = self.pods[(namespace, name)]
        container = pod["spec"]["containers"][0]
        return {
            "name": container["name"],
            "image": container["image"],
            "imageID": "",
            "ready": "running" in state,
            "restartCount": 0,
            "state": state,
        }

    def run(self, namespace: str, name: str, lines: list[str] = ()) -> None:
        """The kubelet started the container (and it wrote ``lines``)."""
        with self.lock:
            cs = self._container_status(namespace, name, {"running": {"startedAt": _now_rfc3339()}})
        for line in lines:
            self.write_log(namespace, name, line)
        self._update_pod(
            namespace,
            name,
            {"phase": "Running", "startTime": _now_rfc3339(), "containerStatuses": [cs]},
        )

    def write_log(self, namespace: str, name: str, line: str) -> None:
        with self.lock:
            stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"
            self.logs.setdefault((namespace, name), []).append((stamp, line))

    def finish(self, namespace: str, name: str, exit_code: int, reason: str = "") -> None:
        """The container ended with ``exit_code`` (``reason`` e.g. OOMKilled)."""
        terminated = {
            "exitCode": exit_code,
            "reason": reason or ("Completed" if exit_code == 0 else "Error"),
            "startedAt": _now_rfc3339(),
            "finishedAt": _now_rfc3339(),
        }
        with self.lock:
            cs = self._container_status(namespace, name, {"terminated": terminated})
        phase = "Succeeded" if exit_code == 0 else "Failed"
        self._update_pod(namespace, name, {"phase": phase, "containerStatuses": [cs]})

    def cannot_pull(self, namespace: str, name: str, reason: str = "ErrImagePull") -> None:
        with self.lock:
            image = self.pods[(namespace, name)]["spec"]["containers"][0]["image"]
            waiting = {
                "reason": reason,
                "message": f'failed to pull and unpack image "{image}": not found',
            }
            cs = self._container_status(namespace, name, {"waiting": waiting})
        self._update_pod(namespace, name, {"phase": "Pending", "containerStatuses": [cs]})

    def delete_pod(self, namespace: str, name: str) -> None:
        """Someone (a person, a controller) removes the Pod."""
        with self.lock:
            pod = self.pods.pop((namespace, name))
            self._bump(pod)
            self._emit("DELETED", pod)

    # --- requests ----------------------------------------------------------------------

    def pod_list(self, selector: str, fields: str = "") -> dict:
        field_matches(fields, {"metadata": {}})  # refuses an unknown field even with no Pods
        with self.lock:
            return {
                "apiVersion": "v1",
                "kind": "PodList",
                "metadata": {"resourceVersion": str(self.version)},
                "items": [
                    copy.deepcopy(p)
                    for p in self.pods.values()
                    if matches(selector, p["metadata"].get("labels") or {})
                    and field_matches(fields, p)
                ],
            }

    def add_foreign_pod(
        self,
        namespace: str,
        name: str,
        node: str,
        gpus: int,
        *,
        phase: str = "Running",
        init_gpus: int = 0,
        resource: str = "nvidia.com/gpu",
    ) -> None:
        """A Pod someone else created and the scheduler bound (not Sluice's: no labels of
        Sluice's), asking ``gpus`` of ``resource`` in its container (and ``init_gpus`` in
        an init container)."""

        def container(cname: str, count: int) -> dict:
            limits = {resource: str(count)} if count else {}
            return {
                "name": cname,
                "image": "other:1",
                "resources": {"limits": limits, "requests": limits},
            }

        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": str(uuid.uuid4()),
                "labels": {"app": name},
                "creationTimestamp": _now_rfc3339(),
            },
            "spec": {"nodeName": node, "containers": [container("main", gpus)]},
            "status": {"phase": phase},
        }
        if init_gpus:
            pod["spec"]["initContainers"] = [container("init", init_gpus)]
        with self.lock:
            self.namespaces.setdefault(namespace, {"metadata": {"name": namespace}})
            self._bump(pod)
            self.pods[(namespace, name)] = pod
            self._emit("ADDED", pod)

    def create_pod(self, namespace: str, body: dict) -> tuple[int, dict]:
        with self.lock:
            if namespace not in self.namespaces:
                return 404, _status(404, "NotFound", f'namespaces "{namespace}" not found')
            meta = body.get("metadata") or {}
            name = meta.get("name", "")
            if meta.get("namespace", namespace) != namespace:
                return 400, _status(400, "BadRequest", "the namespace of the object does not match")
            if not name or not (body.get("spec") or {}).get("containers"):
                return 422, _status(422, "Invalid", "Pod is invalid: name and containers required")
            refused = self.refuse_on_node.get(body["spec"].get("nodeName", ""))
            if refused:
                return refused[0], _status(*refused)
            if (namespace, name) in self.pods:
                return 409, _status(409, "AlreadyExists", f'pods "{name}" already exists')
            pod = copy.deepcopy(body)
            pod.setdefault("apiVersion", "v1")
            pod.setdefault("kind", "Pod")
            pod["metadata"].update(
                namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=_now_rfc3339()
            )
            pod["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
            self._bump(pod)
            self.pods[(namespace, name)] = pod
            self._emit("ADDED", pod)
            return 201, copy.deepcopy(pod)

    def graceful_delete(self, namespace: str, name: str, grace: int | None) -> tuple[int, dict]:
        """The API server marks the Pod; this kubelet ends it at once (SIGTERM honoured:
        exit code 143) and the Pod goes."""
        with self.lock:
            pod = self.pods.get((namespace, name))
            if pod is None:
                return 404, _status(404, "NotFound", f'pods "{name}" not found')
            pod["metadata"]["deletionTimestamp"] = _now_rfc3339()
            pod["metadata"]["deletionGracePeriodSeconds"] = (
                grace if grace is not None else pod["spec"].get("terminationGracePeriodSeconds", 30)
            )
            self._bump(pod)
            self._emit("MODIFIED", pod)
            answer = copy.deepcopy(pod)
            if pod["status"].get("phase") == "Running":
                terminated = {"exitCode": 143, "reason": "Error", "finishedAt": _now_rfc3339()}
                cs = self._container_status(namespace, name, {"terminated": terminated})
                pod["status"].update(phase="Failed", containerStatuses=[cs])
                self._bump(pod)
                self._emit("MODIFIED", pod)
            del self.pods[(namespace, name)]
            self._bump(pod)
            self._emit("DELETED", pod)
            return 200, answer


def _handler(state: StandIn):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            return

        def _send(self, code: int, body, content_type: str = "application/json") -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self, method: str) -> None:
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            parts = url.path.strip("/").split("/")
            with state.lock:
                state.requests.append((method, url.path, query))
            body = None
            if method == "POST":
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
            if parts[:2] != ["api", "v1"]:
                self._send(404, _status(404, "NotFound", "the server could not find the resource"))
                return
            rest = parts[2:]
            if rest == ["namespaces"] and method == "POST":
                name = body["metadata"]["name"]
                with state.lock:
                    if name in state.namespaces:
                        self._send(
                            409,
                            _status(409, "AlreadyExists", f'namespaces "{name}" already exists'),
                        )
                        return
                    ns = copy.deepcopy(body)
                    ns.update(apiVersion="v1", kind="Namespace", status={"phase": "Active"})
                    ns["metadata"].update(uid=str(uuid.uuid4()), creationTimestamp=_now_rfc3339())
                    state._bump(ns)
                    state.namespaces[name] = ns
                self._send(201, ns)
            elif len(rest) == 2 and rest[0] == "namespaces" and method == "GET":
                ns = state.namespaces.get(rest[1])
                if ns is None:
                    self._send(404, _status(404, "NotFound", f'namespaces "{rest[1]}" not found'))
                else:
                    self._send(200, ns)
            elif rest == ["nodes"] and method == "GET":
                with state.lock:
                    items = [
                        copy.deepcopy(n)
                        for n in state.nodes.values()
                        if matches(query.get("labelSelector", ""), n["metadata"]["labels"])
                    ]
                    version = str(state.version)
                self._send(
                    200,
                    {
                        "apiVersion": "v1",
                        "kind": "NodeList",
                        "metadata": {"resourceVersion": version},
                        "items": items,
                    },
                )
            elif rest == ["pods"] and method == "GET":
                if query.get("watch") in ("true", "1"):
                    self._watch(query)
                else:
                    try:
                        listed = state.pod_list(
                            query.get("labelSelector", ""), query.get("fieldSelector", "")
                        )
                    except ValueError as exc:
                        self._send(400, _status(400, "BadRequest", str(exc)))
                    else:
                        self._send(200, listed)
            elif (
                len(rest) == 3
                and rest[0] == "namespaces"
                and rest[2] == "pods"
                and method == "POST"
            ):
                self._send(*state.create_pod(rest[1], body))
            elif len(rest) == 4 and rest[0] == "namespaces" and rest[2] == "pods":
                key = (rest[1], rest[3])
                if method == "DELETE":
                    grace = query.get("gracePeriodSeconds")
                    self._send(*state.graceful_delete(*key, int(grace) if grace else None))
                elif key in state.pods:
                    self._send(200, state.pod(*key))
                else:
                    self._send(404, _status(404, "NotFound", f'pods "{rest[3]}" not found'))
            elif len(rest) == 5 and rest[2] == "pods" and rest[4] == "log" and method == "GET":
                self._log((rest[1], rest[3]), query)
            else:
                self._send(405, _status(405, "MethodNotAllowed", f"{method} {url.path}"))

        def _log(self, key, query) -> None:
            with state.lock:
                pod = state.pods.get(key)
                lines = list(state.logs.get(key, []))
            if pod is None:
                self._send(404, _status(404, "NotFound", f'pods "{key[1]}" not found'))
                return
            if pod["status"].get("phase") == "Pending":
                self._send(
                    400,
                    _status(
                        400, "BadRequest", f'container "job" in pod "{key[1]}" is waiting to start'
                    ),
                )
                return
            since = query.get("sinceSeconds")
            if since:
                cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=int(since))
                lines = [
                    (ts, line)
                    for ts, line in lines
                    if dt.datetime.fromisoformat(ts[:26] + "+00:00")
                    >= cutoff.replace(microsecond=0)
                ]
            stamps = query.get("timestamps") in ("true", "1")
            text = "".join(f"{ts} {line}\n" if stamps else f"{line}\n" for ts, line in lines)
            self._send(200, text, "text/plain")

        def _watch(self, query) -> None:
            selector = query.get("labelSelector", "")
            since = int(query.get("resourceVersion") or 0)
            deadline = time.monotonic() + float(query.get("timeoutSeconds") or 30)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                while True:
                    with state.lock:
                        new = [e for e in state.events if e[0] > since]
                        if not new:
                            left = deadline - time.monotonic()
                            if left <= 0 or state.stopping:
                                break
                            state.lock.wait(min(left, 0.2))
                            continue
                    for version, kind, obj in new:
                        since = version
                        if not matches(selector, obj["metadata"].get("labels") or {}):
                            continue
                        line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass
            self.close_connection = True

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

        def do_DELETE(self) -> None:
            self._route("DELETE")

    return Handler
