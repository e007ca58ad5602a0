"""Tasks of this part of the insights (see insights/tasks.py)."""
