"""Kubernetes pools: Sluice decides who runs where, a Pod in the tenant's namespace runs it.

See docs/operator/executor-kubernetes.md. The bridge: ``python -m
scheduling.executors.kubernetes --pool <pool> (--kubeconfig PATH | --in-cluster)``.
"""
