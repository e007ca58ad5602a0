"""The engine compiled to C with mypyc, and the guard that never lets a stale build run.

The engine is plain, type-annotated Python, and stays the source of truth. ``make native``
(``tools/build_native.py``) compiles its hot modules with mypyc (the compiler mypy and
black ship with) into extension modules beside the sources, which Python then imports
instead of them: a cycle costs about a quarter to a third less (see the README).
The compiled modules check the annotations at run time, so ``make lint`` type-checks the
engine with mypy.

An extension module is imported before its source, even when the source is newer: after
an edit, the old compiled engine would run. :func:`guard` (called first thing by the
package) hashes the sources and compares them with those the build recorded
(``native.stamp``); if they differ, if the build is incomplete (a module, or mypyc's
shared library on the import path, missing), or if ``SLUICE_PURE_ENGINE=1`` is set, the
compiled modules are bypassed and the sources imported, with the reason in the log
(unless asked for). Without a build (no C compiler, ``make run``) the engine is pure
Python.

Not compiled: :mod:`.results` (the records the dispatch loop and the simulator compare),
:mod:`.plan` and the package itself. :mod:`.snapshot` is compiled: the engine reads the
fields of its records at every step, and a compiled class's fields are read directly (an
interpreted one's through a generic attribute lookup, some 8 % of a deep replay). Its
dataclasses keep the methods ``dataclasses`` generates (equality, ``repr``, ``__init__``),
so records are made and compared as before; a compiled record checks the type of each
field it is given (a list where a tuple is declared is refused), and the frozen ones
pickle through ``__reduce__`` (a compiled class would restore its fields by
``setattr``, which a frozen dataclass refuses).
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = __name__.rpartition(".")[0]
COMPILED = (
    "cluster",
    "cycle",
    "explaining",
    "messages",
    "order",
    "ordering",
    "placing",
    "planner",
    "preempting",
    "preemption",
    "quota",
    "reasons",
    "reservations",
    "reserving",
    "settled",
    "snapshot",
    "timeline",
    "usage",
)
STAMP = HERE / "native.stamp"
GROUP = "sluice_engine"  # mypyc's shared library: sluice_engine__mypyc*.so at the project root

log = logging.getLogger(__name__)


def source_digest() -> str:
    """One hash of the sources of the compiled modules (and of this file's list)."""
    digest = hashlib.sha256(" ".join(COMPILED).encode())
    for name in COMPILED:
        digest.update((HERE / f"{name}.py").read_bytes())
    return digest.hexdigest()


def built_modules() -> list[str]:
    """The compiled modules present beside their sources."""
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    return [
        name for name in COMPILED if any((HERE / f"{name}{suffix}").exists() for suffix in suffixes)
    ]


def is_compiled() -> bool:
    """Whether the engine running in this process is the compiled one."""
    module = sys.modules.get(f"{PACKAGE}.planner")
    return module is not None and not str(getattr(module, "__file__", "")).endswith(".py")


def interpreter() -> str:
    """The Python running this process, as the benchmarks report it: its version, and
    whether libpython is linked into the executable or loaded as a shared library (a
    build detail that moves the engine's speed by a fifth; see tools/pick_python.py)."""
    version = ".".join(str(part) for part in sys.version_info[:3])
    try:
        with open("/proc/self/maps") as maps:
            shared = "libpython" in maps.read()
    except OSError:
        return f"{version} {sys.executable}"
    linked = "shared libpython" if shared else "libpython in the executable"
    return f"{version} {sys.executable} ({linked})"


class _Sources(importlib.abc.MetaPathFinder):
    """Imports the compiled modules' sources, ahead of the extension modules."""

    def find_spec(self, fullname, path=None, target=None):
        package, _, name = fullname.rpartition(".")
        if package != PACKAGE or name not in COMPILED:
            return None
        return importlib.util.spec_from_file_location(fullname, HERE / f"{name}.py")


def guard() -> None:
    """Bypass the compiled modules if they are stale, incomplete or not wanted (see the
    module doc)."""
    if any(isinstance(finder, _Sources) for finder in sys.meta_path):
        return
    built = built_modules()
    if not built:
        return
    problem = _problem(built)
    if problem is None:
        return
    if problem:
        log.warning("%s: running the pure-Python engine (`make native` rebuilds it)", problem)
    sys.meta_path.insert(0, _Sources())


def _problem(built: list[str]) -> str | None:
    """Why the compiled modules must not run ("" when the sources are asked for, None
    when they may run)."""
    if os.environ.get("SLUICE_PURE_ENGINE", "") in ("1", "true", "yes"):
        return ""
    stamp = STAMP.read_text().strip() if STAMP.exists() else ""
    if stamp != source_digest():
        return "the compiled engine is older than its sources"
    # A partial build would mix compiled and pure classes of one engine.
    if len(built) != len(COMPILED):
        return "the compiled engine lacks " + ", ".join(sorted(set(COMPILED) - set(built)))
    # The modules' shared library, imported by its own name from the project root.
    if importlib.util.find_spec(f"{GROUP}__mypyc") is None:
        return f"the compiled engine's library {GROUP}__mypyc is not on the import path"
    return None
