"""The Kubernetes bridge: Sluice's runtime serving a pool's Kubernetes nodes.

    python -m scheduling.executors.kubernetes --pool k8s --kubeconfig ~/.kube/config
    python -m scheduling.executors.kubernetes --pool k8s --in-cluster

It discovers the pool's nodes from the API (``--node-selector``), takes each node's
messages from the broker (``node.<name>``) and sends reports back, as an agent does.
"""

from __future__ import annotations

import argparse
import logging
import sys

from kubernetes import client, config

from scheduling.executors.kubernetes.executor import KubernetesExecutor
from scheduling.executors.kubernetes.pods import PodSettings


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m scheduling.executors.kubernetes")
    p.add_argument("--pool", required=True, help="the Sluice pool these nodes belong to")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--kubeconfig", help="a kubeconfig file (outside the cluster)")
    where.add_argument(
        "--in-cluster", action="store_true", help="the Pod's service account (inside it)"
    )
    p.add_argument("--context", default=None, help="the kubeconfig's context (default: current)")
    p.add_argument("--broker", default=None, help="broker URL (default: CELERY_BROKER_URL)")
    p.add_argument("--node-selector", default="", help="label selector of the pool's nodes")
    p.add_argument("--gpu-resource", default="nvidia.com/gpu", help="the GPU extended resource")
    p.add_argument("--namespace-prefix", default="sluice-", help="tenant namespaces' prefix")
    p.add_argument("--default-image", default="", help="image of a job that names none")
    p.add_argument("--run-as-user", type=int, default=None, help="uid of jobs (default: image's)")
    p.add_argument("--serve-port", type=int, default=8000, help="a serving job's port")
    p.add_argument(
        "--dcgm-url",
        default="",
        help="DCGM exporter URL per node, {node} replaced, e.g. http://{node}:9400/metrics",
    )
    p.add_argument("--node-lost-seconds", type=float, default=60.0)
    p.add_argument("--heartbeat", type=float, default=10.0, help="seconds between heartbeats")
    return p


def api_client(args: argparse.Namespace) -> client.ApiClient:
    if args.in_cluster:
        config.load_incluster_config()
        return client.ApiClient()
    return config.new_client_from_config(config_file=args.kubeconfig, context=args.context)


def build_executor(args: argparse.Namespace) -> KubernetesExecutor:
    settings = PodSettings(
        pool=args.pool,
        gpu_resource=args.gpu_resource,
        namespace_prefix=args.namespace_prefix,
        default_image=args.default_image,
        run_as_user=args.run_as_user,
        serve_port=args.serve_port,
    )
    return KubernetesExecutor(
        api_client(args),
        settings,
        node_selector=args.node_selector,
        dcgm_url_template=args.dcgm_url,
        node_lost_seconds=args.node_lost_seconds,
    )


def main(argv: list[str] | None = None) -> int:
    from scheduling.executors.bridge import run_bridge

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args = parser().parse_args(argv)
    return run_bridge(
        build_executor(args),
        pool=args.pool,
        broker=args.broker,
        heartbeat=args.heartbeat,
        no_nodes="no schedulable node matches --node-selector",
    )


if __name__ == "__main__":
    sys.exit(main())
