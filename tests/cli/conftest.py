"""The ``sluice`` CLI driven against ``live_server`` (the test database behind a real HTTP
server in a thread). ``sluice(*argv)`` runs the CLI in-process through ``main(argv, env)``
and returns its exit code and output; the environment is the only thing it gets from the
test (``SLUICE_URL``, ``SLUICE_TOKEN``, ``SLUICE_CONFIG``)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import pytest

from sluice_cli.main import main


@pytest.fixture(scope="session", autouse=True)
def _flush_past_the_audit_guard():
    """Empty the test database after each live-server test although the audit log is
    append-only (see ``tests.audit_helpers.flushes_past_the_audit_guard``). Session-wide,
    because the flush runs after every function-scoped fixture has been torn down."""
    from tests.audit_helpers import flushes_past_the_audit_guard

    with flushes_past_the_audit_guard():
        yield


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)


@pytest.fixture
def cli_env(live_server, transactional_db, tmp_path):
    """The environment the CLI sees: the live server, a config file of its own, no token."""
    return {
        "SLUICE_URL": live_server.url,
        "SLUICE_CONFIG": str(tmp_path / "sluice" / "config.json"),
        "HOME": str(tmp_path),
    }


@pytest.fixture
def sluice(cli_env, capsys):
    """``sluice(*argv, token=key, env={...})`` → ``Run(code, out, err)``."""

    def run(*argv: str, token: str | None = None, env: dict | None = None) -> Run:
        environ = dict(cli_env)
        if token:
            environ["SLUICE_TOKEN"] = token
        environ.update(env or {})
        capsys.readouterr()
        # The live server answers in this process: keep its request log (403s, 400s) out
        # of the CLI's stderr. Errors (500s) still show.
        logging.disable(logging.WARNING)
        try:
            code = main([str(a) for a in argv], env=environ)
        finally:
            logging.disable(logging.NOTSET)
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run


@pytest.fixture
def token_of(api_token):
    """``token_of(user)``: a fresh API key of that user."""
    return lambda user: api_token(user)[1]
