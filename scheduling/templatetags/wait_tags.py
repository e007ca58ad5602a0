"""``{{ job|waited }}``: a job's total wait (re-waits after requeues included), no query."""

from django import template

from scheduling.services.waste import human_duration
from scheduling.waits import job_wait

register = template.Library()


@register.filter
def waited(job) -> str:
    """``2 h 10 min`` (the total of its waits so far); ``+ re-waits`` noted when requeued."""
    wait = job_wait(job)
    text = human_duration(wait.total_seconds)
    if wait.requeues:
        text += f" ({human_duration(wait.rewait_seconds)} after {wait.requeues} requeue"
        text += "s)" if wait.requeues != 1 else ")"
    return text
