from django.apps import AppConfig


class InsightsConfig(AppConfig):
    name = "insights"
    verbose_name = "Insights"

    def ready(self) -> None:
        # The scheduling, below the insights, announces its events by signals; the event
        # metrics listen here rather than the scheduling calling up into the insights.
        from scheduling.signals import dispatch_cycle_finished, jobs_admitted

        from . import instrument

        jobs_admitted.connect(instrument.on_jobs_admitted, dispatch_uid="insights.admissions")
        dispatch_cycle_finished.connect(
            instrument.on_dispatch_cycle_finished, dispatch_uid="insights.dispatch_cycle"
        )
