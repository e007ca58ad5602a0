"""An emulated Slurm cluster on this one machine: one slurmctld, one slurmd per node, fake GPUs.

    python tools/slurm_cluster.py start  [--dir DIR] [--nodes 4] [--gpus 8] [--prefix sn]
    python tools/slurm_cluster.py status [--dir DIR]
    python tools/slurm_cluster.py stop   [--dir DIR]
    python tools/slurm_cluster.py restart-controller [--dir DIR]

Debian's slurmd (22.05) is built with ``--enable-multiple-slurmd``: ``slurmd -N <name>``
serves one ``NodeName=`` of slurm.conf, each on its own ``Port=``, all with
``NodeHostname=<this host>`` and ``NodeAddr=127.0.0.1``. Each node has ``Gres=gpu:<type>:<n>``
backed by plain files ``<dir>/dev/<node>/nvidia<i>``, links to /dev/null (``AutoDetect=off``), so Slurm binds
GPUs and sets ``CUDA_VISIBLE_DEVICES`` as it would on a real node.

The partition (``--partition``, default ``sluice``) is set up so that Slurm never reorders
or starts Sluice's jobs differently from Sluice's decision: ``SchedulerType=sched/builtin``
(strict submit order, no backfill), ``PriorityType=priority/basic`` (priority = submit
order), ``--nodelist`` on every job, and ``OverSubscribe=NO``. See
docs/operator/executor-slurm.md.

Everything lives in ``--dir`` (default ``$SLUICE_SLURM_DIR`` or ``var/slurm``): munge key
and socket, slurm.conf, gres.conf, state, spool, logs and pid files. Clients use the
cluster with ``SLURM_CONF=<dir>/slurm.conf`` (``status`` prints it, ``<dir>/env`` holds it).
Must run as root (slurmd starts jobs as their users). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = Path(os.environ.get("SLUICE_SLURM_DIR") or ROOT / "var" / "slurm")
DAEMONS = ("munged", "slurmctld", "slurmd")


def installed() -> bool:
    """True when the Slurm daemons, the client commands and munge are on PATH."""
    needed = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "squeue", "scancel")
    return all(shutil.which(name) for name in needed)


def _free_ports(count: int) -> list[int]:
    """``count`` consecutive free TCP ports (slurm.conf's ``Port=[a-b]`` needs a range)."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count > 65000:
            continue
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                s.bind(("127.0.0.1", port))
                sockets.append(s)
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
        return list(range(base, base + count))
    raise RuntimeError("no range of free ports found")


def _fake_device(path: Path) -> None:
    """A character device standing for a GPU: slurmd refuses gres files that are not devices.
    A link to /dev/null works everywhere (no mknod on nodev mounts)."""
    if path.is_symlink() or path.exists():
        return
    path.symlink_to("/dev/null")


def node_names(prefix: str, count: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(1, count + 1)]


def write_config(
    directory: Path,
    *,
    nodes: int,
    gpus: int,
    gpu_type: str,
    prefix: str,
    partition: str,
    cluster: str,
) -> dict:
    """Write munge key, slurm.conf and gres.conf under ``directory``; return the layout."""
    for sub in ("state", "spool", "log", "run", "dev", "munge"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(directory / "spool", 0o755)
    os.chmod(directory, 0o755)
    os.chmod(directory / "munge", 0o700)
    key = directory / "munge" / "munge.key"
    if not key.exists():
        key.write_bytes(secrets.token_bytes(1024))
    os.chmod(key, 0o400)
    ports = _free_ports(nodes + 1)
    ctl_port, node_ports = ports[0], ports[1:]
    names = node_names(prefix, nodes)
    host = socket.gethostname()
    cpus = max(gpus * 2, 2)
    lines = [
        f"ClusterName={cluster}",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctl_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={directory}/munge/munge.socket",
        f"StateSaveLocation={directory}/state",
        f"SlurmdSpoolDir={directory}/spool/%n",
        f"SlurmctldPidFile={directory}/run/slurmctld.pid",
        f"SlurmdPidFile={directory}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={directory}/log/slurmctld.log",
        f"SlurmdLogFile={directory}/log/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        # No cgroups in a container: processes are tracked by parent id, tasks not bound.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none",
        "ReturnToService=2",
        # The hardware the nodes claim, not this machine's.
        "SlurmdParameters=config_overrides",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        # Strict submit order, no backfill: Slurm never starts a later job first.
        "SchedulerType=sched/builtin",
        "PriorityType=priority/basic",
        "SchedulerParameters=sched_interval=2",
        "GresTypes=gpu",
        # Jobs' finished records stay visible to scontrol for 10 minutes.
        "MinJobAge=600",
        # What Slurm waits between a cancel's SIGTERM and SIGKILL: Sluice's stop grace comes
        # first (scancel --signal=TERM), so this only adds to it.
        "KillWait=2",
        "InactiveLimit=0",
        "SlurmdTimeout=60",
        "SlurmctldTimeout=30",
        "Waittime=0",
        "MaxJobCount=20000",
        f"NodeName={prefix}[1-{nodes}] NodeHostname={host} NodeAddr=127.0.0.1 "
        f"Port=[{node_ports[0]}-{node_ports[-1]}] CPUs={cpus} RealMemory=64000 "
        f"Gres=gpu:{gpu_type}:{gpus} State=UNKNOWN",
        f"PartitionName={partition} Nodes={prefix}[1-{nodes}] Default=YES MaxTime=INFINITE "
        "OverSubscribe=NO State=UP",
    ]
    (directory / "slurm.conf").write_text("\n".join(lines) + "\n")
    gres = ["AutoDetect=off"]
    for name in names:
        dev = directory / "dev" / name
        dev.mkdir(parents=True, exist_ok=True)
        for i in range(gpus):
            _fake_device(dev / f"nvidia{i}")
        gres.append(f"NodeName={name} Name=gpu Type={gpu_type} File={dev}/nvidia[0-{gpus - 1}]")
    (directory / "gres.conf").write_text("\n".join(gres) + "\n")
    (directory / "env").write_text(f"SLURM_CONF={directory}/slurm.conf\n")
    layout = {
        "dir": str(directory),
        "slurm_conf": str(directory / "slurm.conf"),
        "nodes": names,
        "gpus": gpus,
        "gpu_type": gpu_type,
        "partition": partition,
        "controller_port": ctl_port,
        "node_ports": node_ports,
    }
    (directory / "layout.json").write_text(json.dumps(layout, indent=2) + "\n")
    return layout


def _env(directory: Path) -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": str(directory / "slurm.conf")}


def _pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    return pid


def _pid_files(directory: Path) -> dict[str, Path]:
    layout = json.loads((directory / "layout.json").read_text())
    files = {
        "munged": directory / "munge" / "munged.pid",
        "slurmctld": directory / "run" / "slurmctld.pid",
    }
    for name in layout["nodes"]:
        files[f"slurmd {name}"] = directory / "run" / f"slurmd-{name}.pid"
    return files


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


def start_munge(directory: Path) -> None:
    pid_file = directory / "munge" / "munged.pid"
    if _pid(pid_file):
        return
    subprocess.run(
        [
            "munged",
            "--force",
            f"--key-file={directory}/munge/munge.key",
            f"--socket={directory}/munge/munge.socket",
            f"--pid-file={pid_file}",
            f"--log-file={directory}/log/munged.log",
            f"--seed-file={directory}/munge/munged.seed",
        ],
        check=True,
    )
    _wait(lambda: (directory / "munge" / "munge.socket").exists(), 10, "munged's socket")


def start_controller(directory: Path) -> None:
    if _pid(directory / "run" / "slurmctld.pid"):
        return
    # -i: ignore state that does not match the configuration (ports change between starts).
    subprocess.run(["slurmctld", "-i"], env=_env(directory), check=True)
    _wait(lambda: _scontrol_ping(directory), 30, "slurmctld to answer")


def _scontrol_ping(directory: Path) -> bool:
    result = subprocess.run(
        ["scontrol", "ping"], env=_env(directory), capture_output=True, text=True, check=False
    )
    return "UP" in result.stdout


def start_nodes(directory: Path) -> None:
    layout = json.loads((directory / "layout.json").read_text())
    for name in layout["nodes"]:
        if _pid(directory / "run" / f"slurmd-{name}.pid"):
            continue
        (directory / "spool" / name).mkdir(parents=True, exist_ok=True)
        os.chmod(directory / "spool" / name, 0o755)
        subprocess.run(["slurmd", "-N", name], env=_env(directory), check=True)
    _wait(lambda: _nodes_idle(directory, layout["nodes"]), 60, "the nodes to be idle")


def _nodes_idle(directory: Path, names: list[str]) -> bool:
    result = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %t"],
        env=_env(directory),
        capture_output=True,
        text=True,
        check=False,
    )
    states = dict(line.split() for line in result.stdout.splitlines() if line.strip())
    return all(states.get(name, "").rstrip("*") in ("idle", "mix", "alloc") for name in names)


def start(args: argparse.Namespace) -> dict:
    directory = Path(args.dir).resolve()
    # Jobs run as their own accounts: they must reach the spool's job scripts (slurmd and
    # the folders made here inherit the umask).
    os.umask(0o022)
    if (directory / "layout.json").exists() and _pid(directory / "run" / "slurmctld.pid"):
        return json.loads((directory / "layout.json").read_text())
    layout = write_config(
        directory,
        nodes=args.nodes,
        gpus=args.gpus,
        gpu_type=args.gpu_type,
        prefix=args.prefix,
        partition=args.partition,
        cluster=args.cluster,
    )
    start_munge(directory)
    start_controller(directory)
    start_nodes(directory)
    return layout


def _stop_pid(pid_file: Path, timeout: float = 15) -> None:
    pid = _pid(pid_file)
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


def stop(directory: Path) -> None:
    """Stop the daemons; running jobs' processes die with their slurmstepd."""
    if not (directory / "layout.json").exists():
        return
    files = _pid_files(directory)
    env = _env(directory)
    # Cancel every job (pending ones first, so none starts meanwhile) so that no job's
    # processes outlive their slurmd.
    for state in ("PENDING", "RUNNING"):
        subprocess.run(
            ["scancel", "--full", "--quiet", f"--state={state}"],
            env=env,
            check=False,
            capture_output=True,
            timeout=30,
        )
    for what, pid_file in files.items():
        if what.startswith("slurmd "):
            _stop_pid(pid_file)
    _stop_pid(files["slurmctld"])
    _stop_pid(files["munged"])


def restart_controller(directory: Path) -> None:
    """Stop slurmctld and start it again from its saved state (jobs keep running)."""
    _stop_pid(directory / "run" / "slurmctld.pid")
    os.umask(0o022)
    subprocess.run(["slurmctld"], env=_env(directory), check=True)
    _wait(lambda: _scontrol_ping(directory), 30, "slurmctld to answer")


def status(directory: Path) -> dict:
    if not (directory / "layout.json").exists():
        return {"dir": str(directory), "running": False}
    layout = json.loads((directory / "layout.json").read_text())
    daemons = {what: _pid(path) for what, path in _pid_files(directory).items()}
    return {**layout, "daemons": daemons, "running": all(daemons.values())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("start", "stop", "status", "restart-controller"))
    parser.add_argument("--dir", default=str(DEFAULT_DIR))
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--gpu-type", default="h100")
    parser.add_argument("--prefix", default="sn")
    parser.add_argument("--partition", default="sluice")
    parser.add_argument("--cluster", default="sluice")
    args = parser.parse_args(argv)
    if not installed():
        print(
            "Slurm or munge is not installed (apt-get install slurmctld slurmd munge)",
            file=sys.stderr,
        )
        return 2
    if os.geteuid() != 0:
        print("the emulated cluster needs root (slurmd runs jobs as their users)", file=sys.stderr)
        return 2
    directory = Path(args.dir).resolve()
    if args.action == "start":
        print(json.dumps(start(args), indent=2))
    elif args.action == "stop":
        stop(directory)
    elif args.action == "restart-controller":
        restart_controller(directory)
    else:
        report = status(directory)
        print(json.dumps(report, indent=2))
        return 0 if report["running"] else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
