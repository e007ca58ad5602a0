"""A real OIDC provider (django-oauth-toolkit, tests/identity/oidc_provider) in a subprocess
on a free port, and Sluice's settings pointing at it."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.identity.oidc_provider import setup as op

ROOT = Path(__file__).resolve().parents[2]
CALLBACKS = ["http://testserver/oidc/callback/"]


@dataclass
class Provider:
    url: str
    control_token: str

    @property
    def issuer(self) -> str:
        return f"{self.url}/o"

    def set_groups(self, username: str, groups: list[str]) -> None:
        response = requests.post(
            f"{self.url}/control/groups/{username}",
            data={"groups": ",".join(groups)},
            headers={"X-Control-Token": self.control_token},
            timeout=10,
        )
        response.raise_for_status()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_provider(tmp: Path, callbacks: list[str]):
    """Start the provider; yields a ``Provider`` and stops it afterwards."""
    token = secrets.token_hex(16)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.identity.oidc_provider.settings",
        "OIDC_PROVIDER_DIR": str(tmp),
        "OIDC_PROVIDER_CONTROL_TOKEN": token,
        "PYTHONPATH": str(ROOT),
    }
    subprocess.run(
        [sys.executable, "-m", "tests.identity.oidc_provider.setup", *callbacks],
        env=env,
        cwd=ROOT,
        check=True,
        timeout=120,
    )
    port = _free_port()
    log = (tmp / "provider.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "django", "runserver", f"127.0.0.1:{port}", "--noreload"],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    provider = Provider(url=f"http://127.0.0.1:{port}", control_token=token)
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                requests.get(f"{provider.issuer}/.well-known/openid-configuration", timeout=2)
                break
            except requests.ConnectionError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        "the test OIDC provider did not start: "
                        + (tmp / "provider.log").read_text()[-2000:]
                    ) from None
                time.sleep(0.2)
        yield provider
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


@pytest.fixture(scope="module")
def oidc_provider(tmp_path_factory):
    yield from start_provider(tmp_path_factory.mktemp("oidc-provider"), CALLBACKS)


def configure_sluice(settings, provider: Provider) -> None:
    from identity.oidc import discovery_clear

    settings.SLUICE_OIDC_ISSUER = provider.issuer
    settings.OIDC_RP_CLIENT_ID = op.CLIENT_ID
    settings.OIDC_RP_CLIENT_SECRET = op.CLIENT_SECRET
    settings.SLUICE_OIDC_UNIX_CLAIM = "unix_account"
    settings.OIDC_VERIFY_SSL = False
    backend = "identity.oidc.SluiceOIDCBackend"
    if backend not in settings.AUTHENTICATION_BACKENDS:
        settings.AUTHENTICATION_BACKENDS = [*settings.AUTHENTICATION_BACKENDS, backend]
    discovery_clear()


@pytest.fixture
def oidc_settings(settings, oidc_provider):
    configure_sluice(settings, oidc_provider)
    yield oidc_provider
    from identity.oidc import discovery_clear

    discovery_clear()
