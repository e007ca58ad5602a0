"""Signals the scheduling sends where an event happens, for the apps above it to observe
(the insights' event metrics, for one) without the scheduling importing them.

Senders use ``send_robust``: a receiver's error is logged and never breaks a dispatch cycle.
A receiver does no database query; it runs in the dispatch leader, inside its transaction
where the signal says so.
"""

from django.dispatch import Signal

#: Jobs admitted by a dispatch cycle, sent inside its transaction (``sender``: the Job
#: class). Arguments: ``jobs`` (their tenant, queue, queue's pool and priority class
#: loaded) and ``now``, the admission time. A receiver that acts on the admission defers
#: it to the commit (``transaction.on_commit``): a rolled-back cycle admitted nobody.
jobs_admitted = Signal()

#: A dispatch cycle ran as leader and committed (``sender``: None). Argument: ``seconds``,
#: how long it took (snapshot, plan, apply).
dispatch_cycle_finished = Signal()
