"""The emulated Slurm cluster of the Slurm integration tests (tools/slurm_cluster.py): started
once per module, skipped where Slurm, munge or root are missing (failed instead under
``SLUICE_REQUIRE_SLURM=1``, as in CI), stopped and removed afterwards."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import slurm_cluster  # noqa: E402

#: The account the tenant ``nlp``'s jobs run as on Slurm pools (the site's, on every node).
TENANT_ACCOUNT = "sluice-nlp"


def missing() -> str:
    """Why the emulated cluster cannot run here ("" when it can)."""
    if not slurm_cluster.installed():
        return "Slurm and munge are not installed (apt-get install slurmctld slurmd munge)"
    if os.geteuid() != 0:
        return "the emulated Slurm cluster needs root"
    return ""


@contextlib.contextmanager
def emulated_cluster(
    *, prefix: str, nodes: int, gpus: int, folder_prefix: str, tenant_account: bool = True
) -> Iterator[dict]:
    """Start a cluster of ``nodes`` slurmd with ``gpus`` fake H100s each (named
    ``<prefix>1``…), partition ``sluice``; yields its layout with ``work`` (a folder the job
    accounts reach) and ``directory``."""
    reason = missing()
    if reason:
        if os.environ.get("SLUICE_REQUIRE_SLURM") == "1":
            pytest.fail(f"SLUICE_REQUIRE_SLURM=1 but {reason}")
        pytest.skip(reason)
    directory = Path(tempfile.mkdtemp(prefix=folder_prefix))
    args = slurm_cluster.argparse.Namespace(
        dir=str(directory),
        nodes=nodes,
        gpus=gpus,
        gpu_type="h100",
        prefix=prefix,
        partition="sluice",
        cluster="sluice",
    )
    try:
        layout = slurm_cluster.start(args)
    except Exception:
        for log in sorted((directory / "log").glob("*.log")):
            print(log.name, log.read_text()[-2000:])  # noqa: T201 - why it did not start
        raise
    work = directory / "work"
    work.mkdir()
    work.chmod(0o755)
    if tenant_account:
        try:
            pwd.getpwnam(TENANT_ACCOUNT)
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", TENANT_ACCOUNT], check=True)
    try:
        yield {**layout, "work": work, "directory": directory, "dir": directory}
    finally:
        slurm_cluster.stop(directory)
        shutil.rmtree(directory, ignore_errors=True)
