"""Production settings: never the development secret, and clean under ``manage.py check --deploy``."""

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from portal.settings import env_seconds, time_sharing_levels

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], tmp_path: Path, **env_overrides) -> subprocess.CompletedProcess:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "SLUICE_VAR_DIR": str(tmp_path / "var"),
        "DEBUG": "0",
        **env_overrides,
    }
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_settings_without_secret_key_make_one_private_key_and_keep_it(tmp_path):
    show = "import portal.settings as s; print(s.SECRET_KEY)"
    first = _run(["-c", show], tmp_path)
    second = _run(["-c", show], tmp_path)

    assert first.returncode == 0, first.stderr
    key = first.stdout.strip()
    assert second.stdout.strip() == key
    assert len(key) >= 50 and not key.startswith("django-insecure")
    key_file = tmp_path / "var" / "secret_key"
    assert key_file.read_text().strip() == key
    assert key_file.stat().st_mode & 0o777 == 0o600


def test_settings_prefer_the_secret_key_from_the_environment(tmp_path):
    result = _run(
        ["-c", "import portal.settings as s; print(s.SECRET_KEY)"], tmp_path, SECRET_KEY="x" * 60
    )

    assert result.stdout.strip() == "x" * 60
    assert not (tmp_path / "var" / "secret_key").exists()


def test_debug_uses_the_same_kept_key_as_everything_else(tmp_path):
    """make run exports DEBUG=1, a command typed in a shell does not: both must sign and
    key the audit chain alike, or audit_verify reports a broken chain."""
    show = "import portal.settings as s; print(s.SECRET_KEY)"
    debug = _run(["-c", show], tmp_path, DEBUG="1")
    plain = _run(["-c", show], tmp_path)

    assert debug.returncode == 0, debug.stderr
    assert debug.stdout.strip() == plain.stdout.strip()
    assert not debug.stdout.startswith("django-insecure")


def test_bad_boolean_in_environment_is_a_clear_error(tmp_path):
    result = _run(["-c", "import portal.settings"], tmp_path, DEBUG="maybe")

    assert result.returncode != 0
    assert "DEBUG must be a boolean" in result.stderr


def test_check_deploy_passes_with_secret_key_and_allowed_hosts(tmp_path):
    result = _run(
        ["manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        tmp_path,
        SECRET_KEY=secrets.token_urlsafe(64),
        ALLOWED_HOSTS="sluice.example.com",
        DJANGO_SETTINGS_MODULE="portal.settings",
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_postgresql_prepares_its_frequent_statements_unless_turned_off(tmp_path):
    show = (
        "import portal.settings as s; o = s.DATABASES['default'].get('OPTIONS', {}); "
        "print(o.get('server_side_binding'), o.get('prepare_threshold'))"
    )
    url = "postgres://postgres@127.0.0.1:5432/sluice"
    default = _run(["-c", show], tmp_path, DATABASE_URL=url)
    off = _run(["-c", show], tmp_path, DATABASE_URL=url, SLUICE_DB_PREPARED_STATEMENTS="0")
    sqlite = _run(["-c", show], tmp_path)

    assert default.stdout.split() == ["True", "5"], default.stderr
    assert off.stdout.split() == ["None", "None"], off.stderr
    assert sqlite.stdout.split() == ["None", "None"], sqlite.stderr


def test_time_sharing_settings_are_read_from_the_environment(tmp_path):
    show = (
        "import portal.settings as s; print(s.SLUICE_TIME_SHARING_LEVELS_GPU_HOURS, "
        "s.SLUICE_TIME_SHARING_PROMOTION_SECONDS, s.SLUICE_TIME_SHARING_MIN_WAIT_SECONDS)"
    )
    default = _run(["-c", show], tmp_path)
    chosen = _run(
        ["-c", show],
        tmp_path,
        SLUICE_TIME_SHARING_LEVELS_GPU_HOURS="16, 256,4096",
        SLUICE_TIME_SHARING_PROMOTION_SECONDS="0",
        SLUICE_TIME_SHARING_MIN_WAIT_SECONDS="1800",
    )

    assert default.stdout.split() == ["(64.0,", "1024.0)", "28800.0", "3600.0"], default.stderr
    assert chosen.stdout.split() == ["(16.0,", "256.0,", "4096.0)", "0.0", "1800.0"]


def test_bad_time_sharing_settings_stop_the_start(tmp_path):
    result = _run(
        ["-c", "import portal.settings"], tmp_path, SLUICE_TIME_SHARING_LEVELS_GPU_HOURS="1024,64"
    )

    assert result.returncode != 0
    assert "ImproperlyConfigured: SLUICE_TIME_SHARING_LEVELS_GPU_HOURS" in result.stderr


@pytest.mark.parametrize("raw", ["1024,64", "64,64", "0,64", "-1", "a,b", ",", "64,inf"])
def test_time_sharing_levels_must_be_positive_and_ascending(raw):
    with pytest.raises(ImproperlyConfigured, match="SLUICE_TIME_SHARING_LEVELS_GPU_HOURS"):
        time_sharing_levels("SLUICE_TIME_SHARING_LEVELS_GPU_HOURS", raw, (64.0,))


def test_time_sharing_levels_default_when_unset_or_blank():
    assert time_sharing_levels("X", None, (64.0, 1024.0)) == (64.0, 1024.0)
    assert time_sharing_levels("X", " ", (64.0,)) == (64.0,)
    assert time_sharing_levels("X", "0.5, 8", (64.0,)) == (0.5, 8.0)


@pytest.mark.parametrize("raw", ["-1", "soon", "inf", "nan"])
def test_time_sharing_seconds_must_be_0_or_more(monkeypatch, raw):
    monkeypatch.setenv("SLUICE_TIME_SHARING_MIN_WAIT_SECONDS", raw)
    with pytest.raises(ImproperlyConfigured, match="SLUICE_TIME_SHARING_MIN_WAIT_SECONDS"):
        env_seconds("SLUICE_TIME_SHARING_MIN_WAIT_SECONDS", 3600.0)
