"""The insights' writes, one module an area: ``rollups`` (the rollup writer and the
backfill), ``recommendations`` (the daily refresh; simulate, apply, dismiss) and ``reviews``
(the weekly policy review stored, its admins notified). Pages, the API, tasks and commands
call these; the computations they store stay in ``insights.rollups``,
``insights.recommendations`` and ``insights.reviews``."""
