"""Engine tests need neither Django nor a database.

The repository root is put on ``sys.path`` so that the tests also run with
``-p no:django`` (pytest-django normally does it), and this folder so that the tests can
import their shared builders (``engine_builders``).
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
for path in (str(ROOT), str(HERE)):
    if path not in sys.path:
        sys.path.insert(0, path)
