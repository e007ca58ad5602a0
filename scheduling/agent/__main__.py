"""``python -m scheduling.agent``: run the node agent (see :mod:`scheduling.agent.cli`)."""

import sys

from scheduling.agent.cli import main

sys.exit(main())
