"""What runs a placed job: Sluice's own node agent, Slurm, or Kubernetes.

The control plane (dispatch, reclaim, limits, serving, reconciliation) talks to every
executor through the node wire protocol (:mod:`scheduling.agent.protocol`): ``launch``,
``stop`` and ``kill_process`` messages on a node's queue; ``register``, ``heartbeat``,
``started``, ``exited``, ``log`` and ``serve_metrics`` reports back. On the node side, a
runtime consumes those messages and drives an :class:`~scheduling.executors.base.Executor`,
which is the one interface each kind of executor implements. No Django here.
"""
