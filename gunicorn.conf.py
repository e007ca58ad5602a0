"""gunicorn settings read by ``gunicorn portal.wsgi`` (the Procfile's web line): the hooks
prometheus-client's multiprocess mode needs under gunicorn (docs/insights-metrics.md).

The directory is exported here, in the master, before anything imports prometheus-client:
the workers it forks inherit the variable, and so does a module the master imports. The
rule is the settings' (PROMETHEUS_MULTIPROC_DIR, else $SLUICE_VAR_DIR/prometheus, else
var/prometheus next to this file).
"""

import os
from pathlib import Path

_var = Path(os.environ.get("SLUICE_VAR_DIR") or Path(__file__).resolve().parent / "var")
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(_var / "prometheus"))


def on_starting(server) -> None:
    """The master starts: a fresh start leaves no file of a process that no longer runs."""
    from insights.instrument import multiprocess_dir_prepare

    removed = multiprocess_dir_prepare()
    if removed:
        server.log.info("metrics: removed %d file(s) of exited processes", removed)


def child_exit(server, worker) -> None:
    """A worker exited (or was recycled): prometheus-client's bookkeeping for it."""
    from insights.instrument import process_dead

    process_dead(worker.pid)
