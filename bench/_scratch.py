"""The scratch database of the insights benchmarks: created fresh, migrated with Django set
up, dropped at the end (a PostgreSQL database, or a SQLite file)."""

from __future__ import annotations

import os
from pathlib import Path


def _postgres(database_url: str, *statements: str) -> None:
    """Run ``statements`` (``{name}``: the database's name) on the server's ``postgres``."""
    import psycopg

    base, _, name = database_url.rpartition("/")
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement.format(name=name))


def _sqlite_remove(database_url: str) -> None:
    path = Path(database_url.removeprefix("sqlite:///"))
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def django_start(env: dict[str, str]) -> str:
    """Django set up with ``env`` added to the environment (``portal.settings`` unless it
    names other settings) and the database migrated; returns the database vendor."""
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django.db import connection

    return connection.vendor


def setup_database(database_url: str) -> None:
    """A fresh scratch database named by ``database_url``, migrated, Django set up."""
    if database_url.startswith("sqlite:"):
        _sqlite_remove(database_url)
    else:
        _postgres(
            database_url,
            'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)',
            'CREATE DATABASE "{name}"',
        )
    django_start(
        {
            "DEBUG": "1",
            "DATABASE_URL": database_url,
            "SLUICE_NODE_TRANSPORT": "memory",
            "CELERY_TASK_ALWAYS_EAGER": "1",
        }
    )


def setup_in_var(database_url: str | None, var: Path) -> str:
    """Django set up with ``var`` as SLUICE_VAR_DIR and a fresh database: the PostgreSQL one
    at ``database_url`` (recreated), else a SQLite file in ``var``; returns the vendor."""
    env = {
        "DEBUG": "1",
        "SLUICE_VAR_DIR": str(var),
        "CELERY_TASK_ALWAYS_EAGER": "1",
        "SLUICE_NODE_TRANSPORT": "memory",
        "ALLOWED_HOSTS": "testserver,127.0.0.1,localhost",
        "DJANGO_SETTINGS_MODULE": "portal.settings",
    }
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)  # the settings put it under var
    if database_url:
        _postgres(database_url, 'DROP DATABASE IF EXISTS "{name}"', 'CREATE DATABASE "{name}"')
        env["DATABASE_URL"] = database_url
    else:
        env["DATABASE_URL"] = f"sqlite:///{var / 'bench.sqlite3'}"
    return django_start(env)


def drop_database(database_url: str | None) -> None:
    """Close Django's connections and drop the scratch database (none: nothing to drop)."""
    from django.db import connections

    connections.close_all()
    if not database_url:
        return
    if database_url.startswith("sqlite:"):
        _sqlite_remove(database_url)
    else:
        _postgres(database_url, 'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def backend_cpu_seconds() -> float | None:
    """CPU seconds (user + system) of the PostgreSQL backend of Django's connection so far."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
