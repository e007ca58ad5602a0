from django.apps import AppConfig


class PortalConfig(AppConfig):
    name = "portal"
    verbose_name = "Sluice portal"

    def ready(self) -> None:
        # Every API serializer refuses unknown fields (portal.api.strict).
        from portal.api import strict

        strict.install()
        _psycopg_statement_cache_widen()


#: The most parameters of a statement whose parsing psycopg keeps (its own limit is 50).
STATEMENT_CACHE_PARAMS = 100


def _psycopg_statement_cache_widen() -> None:
    """psycopg keeps the parsing of a statement (its ``%s`` placeholders turned into the
    server's ``$n``) only for statements of at most 50 parameters, and parses any other
    again at every call. A job submission on PostgreSQL is one statement of about 70 (the
    job, its event and its audit row: scheduling.services.jobs._job_event_audit_insert),
    the same text at every call: keep statements of up to 100 too. The cache stays
    bounded by its size (an LRU of 128 statements); a psycopg without the setting is
    left as it is."""
    try:
        from psycopg import _queries
    except ImportError:  # no psycopg: SQLite only
        return
    if (
        getattr(_queries, "MAX_CACHED_STATEMENT_PARAMS", STATEMENT_CACHE_PARAMS)
        < STATEMENT_CACHE_PARAMS
    ):
        _queries.MAX_CACHED_STATEMENT_PARAMS = STATEMENT_CACHE_PARAMS
