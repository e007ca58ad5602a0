"""``sluice``: the command-line client of Sluice's REST API.

A thin client: it speaks HTTP to ``/api/v1/`` with an API token and imports nothing of the
portal or of Django (DESIGN.md §12), so that it starts fast and runs on any machine with
Python, installed with the package (``pip install -e .``).
"""

__version__ = "0.1.0"
