"""The installed `sluice` command (the Makefile's `pip install -e .`) in a subprocess, and
the promise that the CLI imports nothing of Django or the portal."""

import json
import os
import subprocess
import sys
from pathlib import Path

from scheduling.models import Job

SLUICE = Path(sys.executable).parent / "sluice"
PORTAL_PACKAGES = {"django", "rest_framework", "portal", "scheduling", "tenants", "celery"}


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "DJANGO_"))}
    return {**env, **extra}


def test_the_installed_command_submits_and_shows_a_job(world, cli_env, token_of):
    assert SLUICE.exists(), f"{SLUICE} missing: run `make test` (it runs pip install -e .)"
    env = _env(**cli_env, SLUICE_TOKEN=token_of(world.member))

    submitted = subprocess.run(
        [SLUICE, "submit", "-q", "train", "-g", "1", "-t", "30m", "--json", "--", "python", "-V"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert submitted.returncode == 0, submitted.stderr
    job = Job.objects.get(pk=json.loads(submitted.stdout)["id"])
    assert job.command == ["python", "-V"] and job.max_runtime_seconds == 1800

    shown = subprocess.run(
        [SLUICE, "show", str(job.pk)], env=env, capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"Job {job.pk}")

    missing = subprocess.run(
        [SLUICE, "show", "999999"], env=env, capture_output=True, text=True, timeout=60
    )
    assert missing.returncode == 3
    assert missing.stderr == "error: Job not found.\n"


def test_the_cli_imports_nothing_of_django_or_the_portal(tmp_path):
    """Run from an empty folder, so that only the installed package can be found."""
    code = (
        "import sys, sluice_cli.main, sluice_cli.client, sluice_cli.config, sluice_cli.output\n"
        "sys.argv = ['sluice', '--help']\n"
        "try:\n"
        "    sluice_cli.main.main()\n"
        "except SystemExit:\n"
        "    pass\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {PORTAL_PACKAGES!r})\n"
        "print(repr(bad))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
    assert "usage: sluice" in result.stdout
