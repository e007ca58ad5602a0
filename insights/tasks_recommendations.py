"""The daily recommendations run (beat task ``insights.recommendations``, control queue)."""

from celery import shared_task


@shared_task(name="insights.recommendations", ignore_result=True)
def recommendations() -> dict:
    """Run the rules over the recorded history and refresh the open recommendations."""
    from .recommendations import recommendations_refresh

    return recommendations_refresh()
