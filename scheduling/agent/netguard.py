"""The node's network guard: job accounts may not connect to the node's own addresses.

By default a job can connect to anything listening on its node: 127.0.0.1, ::1 and the
node's other addresses. That includes the portal's ``/metrics`` where the portal runs on a
node (the demo), Redis or PostgreSQL bound to loopback, and other tenants' inference
replicas (``/health``, ``/infer``), none of which ask for credentials. This guard, which a
site turns on per node (as root), refuses connections from the job accounts' uids to any
local address, except to the ports it is told to allow::

    python -m scheduling.agent.netguard apply --uid-range 2000-2999 [--allow-port 29500 ...]
    python -m scheduling.agent.netguard status
    python -m scheduling.agent.netguard remove

It installs one nftables table (``inet sluice_netguard``; with ``--backend iptables``, or
where ``nft`` is missing, an ``iptables``/``ip6tables`` chain ``SLUICE_NETGUARD`` matched by
the owner module instead). The rule matches the *sending* socket's owner on the output
path, so:

- a serving replica still works: it listens, and the agent (root) and the balancer connect
  to it; its answers belong to connections others opened and are let through;
- root and the portal's own accounts are not affected;
- a job's processes talking to each other over the node's addresses (``torch.distributed``
  on one node with ``MASTER_ADDR=127.0.0.1``, NCCL's bootstrap) are refused too unless
  their ports are allowed, and an allowed port is open to every job of the range.

Connections to other hosts are not touched. Per-job network namespaces (which would also
keep jobs of one node from each other's allowed ports) are not implemented.
See docs/operator/network.md.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

TABLE = "sluice_netguard"
CHAIN = "SLUICE_NETGUARD"
_PORT = re.compile(r"^(\d{1,5})(?:-(\d{1,5}))?$")


class NetguardError(Exception):
    """The guard could not be applied, removed or read; the message says why."""


@dataclass(frozen=True)
class Guard:
    """What to enforce: the job accounts' uids and the local ports they may still reach."""

    uid_first: int
    uid_last: int
    allowed_ports: tuple[tuple[int, int], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not 0 < self.uid_first <= self.uid_last < 2**32 - 1:
            raise NetguardError(
                f"uid range {self.uid_first}-{self.uid_last}: give FIRST-LAST with "
                "0 < FIRST <= LAST (root, uid 0, is never guarded)"
            )

    @property
    def uids(self) -> str:
        if self.uid_first == self.uid_last:
            return str(self.uid_first)
        return f"{self.uid_first}-{self.uid_last}"


def parse_uid_range(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)(?:-(\d+))?", text.strip())
    if not match:
        raise NetguardError(f"--uid-range {text!r}: give FIRST-LAST, e.g. 2000-2999")
    first = int(match.group(1))
    return first, int(match.group(2) or first)


def parse_port(text: str) -> tuple[int, int]:
    match = _PORT.fullmatch(text.strip())
    if not match:
        raise NetguardError(f"--allow-port {text!r}: give a port or a range, e.g. 29500-29510")
    low = int(match.group(1))
    high = int(match.group(2) or low)
    if not 1 <= low <= high <= 65535:
        raise NetguardError(f"--allow-port {text!r}: ports are 1-65535, low before high")
    return low, high


def _port_text(low: int, high: int) -> str:
    return str(low) if low == high else f"{low}-{high}"


# --- nftables ------------------------------------------------------------------------------


def nft_ruleset(guard: Guard, table: str = TABLE) -> str:
    """The nft script that replaces the table in one transaction."""
    allowed = ", ".join(_port_text(low, high) for low, high in guard.allowed_ports)
    lines = [
        # Declaring, deleting and defining in one file is atomic: no moment without rules.
        f"table inet {table}",
        f"delete table inet {table}",
        f"table inet {table} {{",
        "  chain output {",
        "    type filter hook output priority filter; policy accept;",
        # Answers of connections others opened (the agent scraping a replica) go out.
        f"    meta skuid {guard.uids} ct state established,related accept",
    ]
    if allowed:
        lines.append(
            f"    meta skuid {guard.uids} fib daddr type local "
            f"meta l4proto {{ tcp, udp }} th dport {{ {allowed} }} accept"
        )
    lines += [
        f"    meta skuid {guard.uids} fib daddr type local meta l4proto tcp "
        "counter reject with tcp reset",
        f"    meta skuid {guard.uids} fib daddr type local counter reject",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def _run(argv: list[str], *, stdin: str | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise NetguardError(f"{argv[0]} is not installed") from exc


def _check(result: subprocess.CompletedProcess, what: str) -> str:
    if result.returncode != 0:
        raise NetguardError(f"{what} failed: {(result.stderr or result.stdout).strip()}")
    return result.stdout


def nft_apply(guard: Guard, table: str = TABLE) -> None:
    _check(_run(["nft", "-f", "-"], stdin=nft_ruleset(guard, table)), "nft -f")


def nft_remove(table: str = TABLE) -> bool:
    """Remove the table; False when it was not there."""
    result = _run(["nft", "delete", "table", "inet", table])
    if result.returncode != 0 and "No such file" in result.stderr:
        return False
    _check(result, "nft delete table")
    return True


def nft_status(table: str = TABLE) -> str | None:
    result = _run(["nft", "list", "table", "inet", table])
    if result.returncode != 0:
        return None
    return result.stdout


# --- iptables (owner match), where nftables is not available --------------------------------


def iptables_rules(guard: Guard) -> list[list[str]]:
    """The chain's rules (arguments after ``-A CHAIN``)."""
    owner = ["-m", "owner", "--uid-owner", guard.uids]
    local = ["-m", "addrtype", "--dst-type", "LOCAL"]
    rules = [owner + ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"]]
    for low, high in guard.allowed_ports:
        ports = f"{low}:{high}" if low != high else str(low)
        for proto in ("tcp", "udp"):
            rules.append(owner + local + ["-p", proto, "--dport", ports, "-j", "ACCEPT"])
    rules.append(owner + local + ["-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"])
    rules.append(owner + local + ["-j", "REJECT"])
    return rules


def iptables_apply(guard: Guard, chain: str = CHAIN) -> None:
    for tool in ("iptables", "ip6tables"):
        iptables_remove(chain, tools=(tool,))
        _check(_run([tool, "-N", chain]), f"{tool} -N")
        for rule in iptables_rules(guard):
            _check(_run([tool, "-A", chain, *rule]), f"{tool} -A")
        _check(_run([tool, "-I", "OUTPUT", "1", "-j", chain]), f"{tool} -I OUTPUT")


def iptables_remove(chain: str = CHAIN, tools=("iptables", "ip6tables")) -> bool:
    removed = False
    for tool in tools:
        while _run([tool, "-D", "OUTPUT", "-j", chain]).returncode == 0:
            removed = True
        if _run([tool, "-F", chain]).returncode == 0:
            _run([tool, "-X", chain])
            removed = True
    return removed


def iptables_status(chain: str = CHAIN) -> str | None:
    result = _run(["iptables", "-S", chain])
    return result.stdout if result.returncode == 0 else None


# --- the command ---------------------------------------------------------------------------


def pick_backend(requested: str) -> str:
    if requested != "auto":
        return requested
    if shutil.which("nft"):
        return "nft"
    if shutil.which("iptables"):
        return "iptables"
    raise NetguardError("neither nft nor iptables is installed: apt-get install nftables")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scheduling.agent.netguard",
        description="Refuse the job accounts' connections to this node's own addresses.",
    )
    parser.add_argument("action", choices=["apply", "remove", "status"])
    parser.add_argument("--uid-range", help="the job accounts' uids, FIRST-LAST (apply)")
    parser.add_argument(
        "--allow-port",
        action="append",
        default=[],
        metavar="PORT[-PORT]",
        help="a local port (or range) job accounts may still connect to; repeatable",
    )
    parser.add_argument("--backend", choices=["auto", "nft", "iptables"], default="auto")
    parser.add_argument("--table", default=TABLE, help=argparse.SUPPRESS)
    parser.add_argument(
        "--dry-run", action="store_true", help="print the rules (nft script) and change nothing"
    )
    args = parser.parse_args(argv)
    try:
        if args.action == "apply":
            if not args.uid_range:
                parser.error("apply needs --uid-range FIRST-LAST")
            first, last = parse_uid_range(args.uid_range)
            guard = Guard(first, last, tuple(parse_port(p) for p in args.allow_port))
            if args.dry_run:
                print(nft_ruleset(guard, args.table), end="")
                return 0
            _need_root()
            backend = pick_backend(args.backend)
            if backend == "nft":
                nft_apply(guard, args.table)
            else:
                iptables_apply(guard)
            allowed = ", ".join(_port_text(*p) for p in guard.allowed_ports) or "none"
            print(
                f"network guard on ({backend}): uids {guard.uids} may not connect to this "
                f"node's addresses; allowed ports: {allowed}"
            )
        elif args.action == "remove":
            _need_root()
            backend = pick_backend(args.backend)
            gone = nft_remove(args.table) if backend == "nft" else iptables_remove()
            print("network guard removed" if gone else "network guard was not on")
        else:
            backend = pick_backend(args.backend)
            listing = nft_status(args.table) if backend == "nft" else iptables_status()
            print(listing if listing else "network guard is off", end="" if listing else "\n")
    except NetguardError as exc:
        print(f"netguard: {exc}", file=sys.stderr)
        return 1
    return 0


def _need_root() -> None:
    if os.geteuid() != 0:
        raise NetguardError("run as root: installing firewall rules needs it")


if __name__ == "__main__":
    sys.exit(main())
