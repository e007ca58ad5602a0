"""``python -m scheduling.simulator --trace ...`` (see :mod:`scheduling.simulator.cli`)."""

from .cli import main

raise SystemExit(main())
