"""A throwaway OpenLDAP server for the tests: Debian's slapd, run as the current user in a
temporary directory on a free port, with a self-signed CA made at start and StartTLS
required for every operation (``security tls=1``)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SLAPD = "/usr/sbin/slapd"
SLAPADD = "/usr/sbin/slapadd"
LDAPMODIFY = "/usr/bin/ldapmodify"
SCHEMA_DIR = Path("/etc/ldap/schema")
MODULE_DIR = Path("/usr/lib/ldap")

BASE = "dc=example,dc=org"
ROOT_DN = f"cn=admin,{BASE}"
ROOT_PASSWORD = "root-secret"
BIND_DN = f"cn=sluice,ou=services,{BASE}"
BIND_PASSWORD = "sluice-bind-secret"
PEOPLE = f"ou=people,{BASE}"
GROUPS = f"ou=groups,{BASE}"
# OpenLDAP has no userAccountControl: this directory marks a disabled account with
# employeeType=disabled (SLUICE_LDAP_DISABLED_FILTER says which filter a site uses).
DISABLED_FILTER = "(employeeType=disabled)"


def group_dn(cn: str) -> str:
    return f"cn={cn},{GROUPS}"


def person_dn(uid: str) -> str:
    return f"uid={uid},{PEOPLE}"


@dataclass
class Person:
    uid: str
    password: str
    uid_number: int
    given_name: str
    surname: str
    groups: list[str] = field(default_factory=list)
    disabled: bool = False


PEOPLE_ENTRIES = [
    Person("alice", "alice-pass-1", 10001, "Alice", "Archer", ["nlp-admins", "nlp-users"]),
    Person("bob", "bob-pass-2", 10002, "Bob", "Baker", ["nlp-users"]),
    Person("carol", "carol-pass-3", 10003, "Carol", "Cook", ["nlp-users"], disabled=True),
    Person("dave", "dave-pass-4", 10004, "Dave", "Diver", []),
    Person("erin", "erin-pass-5", 10005, "Erin", "Eagle", ["platform-admins", "nlp-viewers"]),
]
GROUP_NAMES = ["nlp-admins", "nlp-users", "nlp-viewers", "platform-admins", "empty"]


def slapd_missing_reason() -> str | None:
    """Why the tests cannot start slapd here, or None when they can."""
    for tool in (SLAPD, SLAPADD, LDAPMODIFY, shutil.which("openssl")):
        if not tool or not os.access(tool, os.X_OK):
            return (
                f"{tool or 'openssl'} is not installed (apt-get install slapd ldap-utils openssl)"
            )
    if not (MODULE_DIR / "back_mdb.la").exists() and not (MODULE_DIR / "back_mdb.so").exists():
        return f"slapd's back_mdb module is not in {MODULE_DIR}"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(*args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=True, capture_output=True, text=True, **kwargs)


def _make_certificates(d: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 and localhost, signed by it."""
    ca_key, ca_crt = d / "ca.key", d / "ca.crt"
    key, csr, crt = d / "server.key", d / "server.csr", d / "server.crt"
    ext = d / "server.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=Sluice test CA", "-keyout", ca_key, "-out", ca_crt)  # fmt: skip
    _run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
         "-keyout", key, "-out", csr)  # fmt: skip
    _run("openssl", "x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key,
         "-CAcreateserial", "-days", "2", "-extfile", ext, "-out", crt)  # fmt: skip
    return ca_crt, crt, key


def _person_ldif(p: Person) -> str:
    lines = [
        f"dn: {person_dn(p.uid)}",
        "objectClass: inetOrgPerson",
        "objectClass: posixAccount",
        f"uid: {p.uid}",
        f"cn: {p.given_name} {p.surname}",
        f"givenName: {p.given_name}",
        f"sn: {p.surname}",
        f"mail: {p.uid}@example.org",
        f"uidNumber: {p.uid_number}",
        "gidNumber: 10000",
        f"homeDirectory: /home/{p.uid}",
        # Cleartext: slapd compares it as is; a test directory needs no hashing.
        f"userPassword: {p.password}",
    ]
    if p.disabled:
        lines.append("employeeType: disabled")
    return "\n".join(lines) + "\n"


def _directory_ldif() -> str:
    parts = [
        f"dn: {BASE}\nobjectClass: dcObject\nobjectClass: organization\ndc: example\no: Example\n",
        f"dn: ou=people,{BASE}\nobjectClass: organizationalUnit\nou: people\n",
        f"dn: ou=groups,{BASE}\nobjectClass: organizationalUnit\nou: groups\n",
        f"dn: ou=services,{BASE}\nobjectClass: organizationalUnit\nou: services\n",
        f"dn: {BIND_DN}\nobjectClass: organizationalRole\nobjectClass: simpleSecurityObject\n"
        f"cn: sluice\nuserPassword: {BIND_PASSWORD}\n",
    ]
    parts += [_person_ldif(p) for p in PEOPLE_ENTRIES]
    for name in GROUP_NAMES:
        members = [person_dn(p.uid) for p in PEOPLE_ENTRIES if name in p.groups]
        # groupOfNames needs a member; an empty group holds the bind account only.
        members = members or [BIND_DN]
        parts.append(
            f"dn: {group_dn(name)}\nobjectClass: groupOfNames\ncn: {name}\n"
            + "".join(f"member: {m}\n" for m in members)
        )
    return "\n".join(parts)


def _slapd_conf(d: Path, ca: Path, crt: Path, key: Path) -> str:
    schemas = "".join(
        f"include {SCHEMA_DIR / name}.schema\n"
        for name in ("core", "cosine", "nis", "inetorgperson")
    )
    return f"""{schemas}
modulepath {MODULE_DIR}
moduleload back_mdb
pidfile {d / "slapd.pid"}
argsfile {d / "slapd.args"}
TLSCACertificateFile {ca}
TLSCertificateFile {crt}
TLSCertificateKeyFile {key}
# Every operation needs TLS (StartTLS on ldap://): a plain bind is refused.
security tls=1

database mdb
maxsize 104857600
suffix "{BASE}"
rootdn "{ROOT_DN}"
rootpw {ROOT_PASSWORD}
directory {d / "data"}
access to attrs=userPassword
    by self write
    by anonymous auth
    by * none
access to *
    by dn.exact="{BIND_DN}" read
    by self read
    by * none
"""


class Slapd:
    """slapd started in ``directory``; ``uri``, ``ca_file`` and the bind account for Sluice."""

    def __init__(self, directory: Path):
        self.dir = directory
        self.port = _free_port()
        self.uri = f"ldap://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Slapd:
        d = self.dir
        (d / "data").mkdir(parents=True)
        self.ca_file, crt, key = _make_certificates(d)
        conf = d / "slapd.conf"
        conf.write_text(_slapd_conf(d, self.ca_file, crt, key))
        (d / "directory.ldif").write_text(_directory_ldif())
        _run(SLAPADD, "-f", conf, "-l", d / "directory.ldif")
        self.log = open(d / "slapd.log", "w")  # noqa: SIM115 (closed in stop)
        # -d keeps slapd in the foreground, so it is ours to stop.
        self.proc = subprocess.Popen(
            [SLAPD, "-f", str(conf), "-h", f"{self.uri}/", "-d", "0"],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"slapd exited: {(d / 'slapd.log').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("slapd did not listen within 20 s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "log", None):
            self.log.close()

    def modify(self, ldif: str) -> None:
        """Change the directory as its administrator would (ldapmodify over StartTLS)."""
        env = {**os.environ, "LDAPTLS_CACERT": str(self.ca_file), "LDAPTLS_REQCERT": "demand"}
        subprocess.run(
            [LDAPMODIFY, "-x", "-ZZ", "-H", self.uri, "-D", ROOT_DN, "-w", ROOT_PASSWORD],
            input=ldif,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )

    def disable(self, uid: str) -> None:
        self.modify(
            f"dn: {person_dn(uid)}\nchangetype: modify\nadd: employeeType\nemployeeType: disabled\n"
        )

    def delete(self, uid: str) -> None:
        self.modify(f"dn: {person_dn(uid)}\nchangetype: delete\n")

    def remove_from_group(self, uid: str, group: str) -> None:
        self.modify(
            f"dn: {group_dn(group)}\nchangetype: modify\ndelete: member\nmember: {person_dn(uid)}\n"
        )

    def add_to_group(self, uid: str, group: str) -> None:
        self.modify(
            f"dn: {group_dn(group)}\nchangetype: modify\nadd: member\nmember: {person_dn(uid)}\n"
        )
