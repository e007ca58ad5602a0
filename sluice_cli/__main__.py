"""``python -m sluice_cli``: the same as the ``sluice`` command."""

import sys

from .main import main

sys.exit(main())
