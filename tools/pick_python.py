"""Print the Python 3.11 that ``make`` should build ``.venv`` with (``make PYTHON=...``
overrides it).

Every ``python3.11`` and ``python3`` on the PATH is asked, in PATH order, for its version,
whether ``-m venv`` can install pip into a new environment (``ensurepip``), whether its
headers are there (the engine compiles against them: ``make native``) and whether it is
built for speed. Among the 3.11 interpreters that can make a virtual environment, the
first with headers and a build for speed wins, then the first with headers, then the
first. None at all: ``python3``.

*Built for speed*: configured with ``--enable-optimizations`` or ``--with-lto`` (python.org's
and the official container images' builds), or running with libpython linked into the
executable rather than loaded as a shared library (Debian's and Ubuntu's own
``python3.11``, built with profile-guided and link-time optimisation). pyenv's default
build is neither, and the difference is not small: on the same 2-core machine the deep
backlog replay took 170 s under pyenv's 3.11.7 and 137 s under Debian's 3.11.2, same code,
same decisions (docs/decisions/). Run with any Python 3; uses only the standard
library. Should the chosen one still fail to make the environment (a Debian python3.11
without the python3.11-venv package can import ``ensurepip`` but has no pip to install),
the Makefile falls back to ``python3``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

WANTED = (3, 11)
NAMES = ("python3.11", "python3")

# Run inside each candidate: what it is and how it was built.
PROBE = r"""
import json, os, sys, sysconfig
try:
    import ensurepip, venv
    can_venv = True
except ImportError:
    can_venv = False
include = sysconfig.get_paths().get("include") or ""
args = sysconfig.get_config_var("CONFIG_ARGS") or ""
try:
    with open("/proc/self/maps") as maps:
        shared = "libpython" in maps.read()
except OSError:
    shared = True
print(json.dumps({
    "version": list(sys.version_info[:2]),
    "executable": os.path.realpath(sys.executable),
    "venv": can_venv,
    "headers": os.path.exists(os.path.join(include, "Python.h")),
    "fast": "--enable-optimizations" in args or "--with-lto" in args or not shared,
}))
"""


def candidates() -> list[str]:
    """Every executable called one of NAMES on the PATH, in PATH order."""
    found = []
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        for name in NAMES:
            path = os.path.join(directory or ".", name)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                found.append(path)
    return found


def describe(path: str) -> dict | None:
    """What the interpreter at ``path`` says of itself (None if it does not answer)."""
    try:
        done = subprocess.run(
            [path, "-c", PROBE], capture_output=True, text=True, timeout=30, check=True
        )
        return json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def pick(described: list[dict]) -> str | None:
    """The executable of the best of the described interpreters (PATH order; see the
    module doc), or None."""
    usable = [info for info in described if tuple(info["version"]) == WANTED and info["venv"]]
    for wanted in (lambda i: i["headers"] and i["fast"], lambda i: i["headers"], lambda i: True):
        for info in usable:
            if wanted(info):
                return info["executable"]
    return None


def main() -> int:
    seen: set[str] = set()
    described = []
    for path in candidates():
        info = describe(path)
        if info is None or info["executable"] in seen:
            continue
        seen.add(info["executable"])
        described.append(info)
    chosen = pick(described)
    print(chosen or "python3")
    return 0


if __name__ == "__main__":
    sys.exit(main())
