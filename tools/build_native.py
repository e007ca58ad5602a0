"""Compile the scheduling engine with mypyc (``make native``; see scheduling/engine/native.py).

Run from anywhere: ``.venv/bin/python tools/build_native.py``. Needs a C compiler and
the Python headers; mypy (which ships mypyc) and setuptools come with
requirements-dev.txt. Writes the extension modules beside the engine's sources, mypyc's
shared library at the project root, C files under build/native, and the stamp that
tells the engine which sources the build is of.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mypyc.build import mypycify  # noqa: E402
from setuptools import setup  # type: ignore[import-untyped]  # noqa: E402

from scheduling.engine.native import COMPILED, GROUP, HERE, STAMP, source_digest  # noqa: E402


def main() -> None:
    """Compile the engine in place and record the sources it was built from."""
    os.chdir(ROOT)
    # Unlinked, not overwritten: this process may have the old ones loaded.
    STAMP.unlink(missing_ok=True)
    for old in [*HERE.glob("*.so"), *ROOT.glob(f"{GROUP}__mypyc*.so")]:
        old.unlink()
    digest = source_digest()
    paths = [str((HERE / f"{name}.py").relative_to(ROOT)) for name in COMPILED]
    setup(
        name="sluice-engine-native",
        packages=[],
        py_modules=[],
        ext_modules=mypycify(paths, group_name=GROUP, opt_level="3", target_dir="build/native"),
        # --force: compile afresh rather than reuse objects or libraries left under build/
        # by an earlier build, which may have been made for another interpreter (they share
        # the ABI tag); this script only runs when the sources changed, or by hand.
        script_args=["build_ext", "--inplace", "--force", "--build-temp", "build/native"],
    )
    STAMP.write_text(digest + "\n")
    print(f"compiled engine: {len(COMPILED)} modules, stamp {digest[:12]}")


if __name__ == "__main__":
    main()
