"""Pages, API and reads of runtime limits, runtime extensions, idle reclaim and GPU recovery.

The writes are services in ``scheduling.services`` (``limits``, ``reclaim``, ``recovery``).
"""
