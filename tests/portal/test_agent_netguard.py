"""The node's network guard (scheduling.agent.netguard): job accounts may not connect to
the node's own addresses, except allowed ports; root and listening replicas are unaffected.

The rules are applied for real where the machine allows (root, nft, a kernel that takes the
rules), in a table of this test's own and for a throwaway uid range no account uses, and
removed afterwards; elsewhere those tests skip and say why.
"""

import os
import shutil
import socket
import subprocess
import sys

import pytest

from scheduling.agent import netguard

UID = 64_993  # a throwaway uid: no account, no files
RANGE = "64990-64999"
# The interpreter itself, not the venv's link to it: the throwaway uid may not be able to
# pass through the folders of a checkout (a clone in root's 0700 home).
PYTHON = os.path.realpath(sys.executable)


def test_the_ruleset_guards_the_range_and_lets_answers_and_allowed_ports_through():
    guard = netguard.Guard(64990, 64999, ((29500, 29500), (8000, 8010)))

    script = netguard.nft_ruleset(guard, "t")

    assert "meta skuid 64990-64999 ct state established,related accept" in script
    assert "th dport { 29500, 8000-8010 } accept" in script
    assert script.index("accept") < script.index("reject")
    assert "fib daddr type local" in script  # 127.0.0.1, ::1 and the node's own addresses


def test_bad_arguments_are_refused_with_a_clear_message(capsys):
    assert netguard.main(["apply", "--uid-range", "0-10", "--dry-run"]) == 1
    assert "root, uid 0, is never guarded" in capsys.readouterr().err
    assert netguard.main(["apply", "--uid-range", "x", "--dry-run"]) == 1
    assert netguard.main(["apply", "--uid-range", "2000-2999", "--allow-port", "70000"]) == 1
    assert "ports are 1-65535" in capsys.readouterr().err
    assert netguard.main(["apply", "--uid-range", "2000-2999", "--dry-run"]) == 0
    assert "meta skuid 2000-2999" in capsys.readouterr().out


def test_iptables_fallback_rules_match_the_owner_and_local_addresses():
    rules = netguard.iptables_rules(netguard.Guard(2000, 2999, ((29500, 29500),)))

    assert rules[0][-2:] == ["-j", "ACCEPT"] and "ESTABLISHED,RELATED" in rules[0]
    assert all(r[:4] == ["-m", "owner", "--uid-owner", "2000-2999"] for r in rules)
    assert any("--dport" in r and "29500" in r for r in rules)
    assert rules[-1][-2:] == ["-j", "REJECT"]


# --- applied for real ----------------------------------------------------------------------


def _why_not_here() -> str | None:
    if os.geteuid() != 0:
        return "needs root to install firewall rules and to run as a throwaway uid"
    if not shutil.which("nft"):
        return "nft is not installed (apt-get install nftables)"
    probe = subprocess.run(
        ["nft", "-f", "-"],
        input="table inet sluice_netguard_probe\ndelete table inet sluice_netguard_probe\n",
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return f"this kernel or container refuses nftables rules: {probe.stderr.strip()}"
    return None


needs_nft = pytest.mark.skipif(_why_not_here() is not None, reason=str(_why_not_here()))


def _listener(host="127.0.0.1"):
    server = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    server.bind((host, 0))
    server.listen(8)
    return server


def _connect_as(uid: int, host: str, port: int) -> str:
    """Connect from a process running as ``uid``; what happened, in one word."""
    code = (
        "import socket, sys\n"
        f"s = socket.socket(socket.AF_INET6 if ':' in {host!r} else socket.AF_INET)\n"
        "s.settimeout(3)\n"
        f"try:\n    s.connect(({host!r}, {port}))\n    print('connected')\n"
        "except ConnectionRefusedError:\n    print('refused')\n"
        "except OSError as exc:\n    print(type(exc).__name__)\n"
    )
    result = subprocess.run(
        [PYTHON, "-I", "-c", code],
        user=uid,
        group=uid,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
    )
    return result.stdout.strip() or result.stderr.strip()


@pytest.fixture
def guard_table():
    table = f"sluice_netguard_test_{os.getpid()}"
    yield table
    netguard.nft_remove(table)
    assert netguard.nft_status(table) is None


@needs_nft
def test_a_job_account_cannot_reach_a_loopback_service_but_root_can(guard_table):
    service = _listener()
    port = service.getsockname()[1]
    try:
        assert _connect_as(UID, "127.0.0.1", port) == "connected"  # before: anything goes

        assert netguard.main(["apply", "--uid-range", RANGE, "--table", guard_table]) == 0

        assert _connect_as(UID, "127.0.0.1", port) == "refused"
        with socket.create_connection(("127.0.0.1", port), timeout=3):
            pass  # root (the agent, the portal) is not affected
    finally:
        service.close()


@needs_nft
def test_an_allowed_port_stays_reachable(guard_table):
    allowed, other = _listener(), _listener()
    try:
        port = allowed.getsockname()[1]
        assert (
            netguard.main(
                ["apply", "--uid-range", RANGE, "--allow-port", str(port), "--table", guard_table]
            )
            == 0
        )

        assert _connect_as(UID, "127.0.0.1", port) == "connected"
        assert _connect_as(UID, "127.0.0.1", other.getsockname()[1]) == "refused"
    finally:
        allowed.close()
        other.close()


@needs_nft
def test_a_replica_run_by_a_job_account_still_answers_root(guard_table):
    """A serving replica listens; the agent (root) connects and the replica answers."""
    assert netguard.main(["apply", "--uid-range", RANGE, "--table", guard_table]) == 0
    code = (
        "import socket\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)\n"
        "print(s.getsockname()[1], flush=True)\n"
        "c, _ = s.accept(); c.sendall(b'ok'); c.close()\n"
    )
    replica = subprocess.Popen(
        [PYTHON, "-I", "-c", code],
        user=UID,
        group=UID,
        extra_groups=[],
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        port = int(replica.stdout.readline())
        with socket.create_connection(("127.0.0.1", port), timeout=3) as conn:
            conn.settimeout(3)
            assert conn.recv(2) == b"ok"
    finally:
        replica.kill()
        replica.wait()


@needs_nft
def test_status_and_remove(guard_table, capsys):
    assert netguard.main(["status", "--table", guard_table]) == 0
    assert "network guard is off" in capsys.readouterr().out
    netguard.main(["apply", "--uid-range", RANGE, "--table", guard_table])
    capsys.readouterr()
    assert netguard.main(["status", "--table", guard_table]) == 0
    assert "meta skuid 64990-64999" in capsys.readouterr().out
    assert netguard.main(["remove", "--table", guard_table]) == 0
    assert "network guard removed" in capsys.readouterr().out
