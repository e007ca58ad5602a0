"""deploy/kubernetes: the kinds a site applies, and RBAC rules that allow exactly the
calls the executor makes (checked against the calls it made to the stand-in)."""

from pathlib import Path

import yaml

from scheduling.executors.kubernetes.executor import API_CALLS
from scheduling.executors.kubernetes.pods import pod_name
from tests.executors.kubernetes.conftest import poll_until
from tests.executors.kubernetes.test_kubernetes_executor import NS, exits, launch

MANIFEST = Path(__file__).resolve().parents[3] / "deploy/kubernetes/sluice-kubernetes-bridge.yaml"


def documents():
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def allowed() -> set[tuple[str, str, str]]:
    (role,) = [d for d in documents() if d["kind"] == "ClusterRole"]
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_kinds_and_bindings():
    by_kind = {d["kind"]: d for d in documents()}
    assert set(by_kind) == {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
    }
    binding = by_kind["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == by_kind["ClusterRole"]["metadata"]["name"]
    account = by_kind["ServiceAccount"]["metadata"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]
    pod = by_kind["Deployment"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["name"]
    assert pod["containers"][0]["command"][-1] == "scheduling.executors.kubernetes"
    assert by_kind["Deployment"]["spec"]["strategy"]["type"] == "Recreate"


def test_rbac_allows_exactly_the_executors_calls():
    assert allowed() == set(API_CALLS)
    assert not any(verb in ("*", "escalate", "bind", "impersonate") for *_, verb in allowed())


def _verb(method: str, path: str, query: dict) -> tuple[str, str, str]:
    parts = path.strip("/").split("/")[2:]  # after api/v1
    if parts[-1] == "log":
        return "", "pods/log", "get"
    if parts == ["namespaces"]:
        return "", "namespaces", {"POST": "create"}[method]
    if parts[0] == "namespaces" and len(parts) == 2:
        return "", "namespaces", {"GET": "get"}[method]
    if parts == ["nodes"]:
        return "", "nodes", "list"
    if parts == ["pods"]:
        return "", "pods", "watch" if query.get("watch") == "true" else "list"
    single = len(parts) == 4
    verbs = {"POST": "create", "DELETE": "delete", "GET": "get" if single else "list"}
    return "", "pods", verbs[method]


def test_every_call_made_is_allowed(standin, executor):
    executor.nodes()
    executor.launch("gpu-1", launch())
    name = pod_name(7, 1, "gpu-1")
    standin.run(NS, name, ["hello"])
    poll_until(executor, lambda ev: ev)
    standin.finish(NS, name, 0)
    (exited,) = exits(poll_until(executor, exits))
    executor.delivered(exited)
    made = {_verb(*request) for request in standin.requests}
    assert {("", "pods", "watch"), ("", "pods/log", "get"), ("", "pods", "delete")} <= made
    assert made <= allowed()
