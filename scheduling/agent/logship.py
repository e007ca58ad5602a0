"""Shipping a job's output as ``log`` reports, up to its cap (part of the node agent's
:class:`~scheduling.agent.executor.LocalProcessExecutor`)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from scheduling.agent.config import AgentConfig
from scheduling.agent.jobstore import JobStore
from scheduling.agent.protocol import log_truncated_marker
from scheduling.agent.runner import JobRecord
from scheduling.executors.base import Event, LogChunk

logger = logging.getLogger(__name__)


def utf8_complete_length(data: bytes) -> int:
    """Length of the longest prefix of ``data`` that does not end inside a UTF-8 character.

    Log chunks are cut there so that a character split across two chunks is not turned
    into two replacement characters.
    """
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # continuation byte: look further back for the lead byte
            continue
        if byte < 0x80:
            return len(data)
        needed = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4
        return len(data) if back >= needed else len(data) - back
    return len(data)


#: Queues an event for the runtime, with what to do once its report is delivered.
Emit = Callable[[Event, Callable[[], None] | None], None]


class LogShipper:
    """Ships each running job's new output every ``log_interval_seconds``, and an ended
    job's rest before its exit, in chunks cut at whole UTF-8 characters, up to the job's
    log cap, then a marker chunk, then nothing more (the job goes on; see the protocol).

    ``log_offset`` in a job's state is what was delivered: a restarted agent resumes there.
    """

    def __init__(self, config: AgentConfig, store: JobStore, emit: Emit) -> None:
        self.config = config
        self.store = store
        self.emit = emit

    def ship_due(self) -> None:
        """Ship the new output of the running jobs whose turn it is."""
        now = time.monotonic()
        for record in self.store.running():
            if now >= record.next_log_ship:
                record.next_log_ship = now + self.config.log_interval_seconds
                self.ship(record, final=False)

    def ship(self, record: JobRecord, *, final: bool) -> bool:
        """Queue up to one pass worth of new output; True when all output so far is queued.

        ``final`` (the job has ended) also sends a trailing partial UTF-8 character.
        """
        path = self.store.paths(record).log
        cap = record.log_cap_bytes or self.config.log_cap_bytes
        if record.log_truncated or record.log_marker_queued:
            self._trim_log(record, path, cap)
            return True
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return True
        over = size > cap
        end = min(size, cap)
        if end <= record.log_read_offset and not over:
            return True
        with path.open("rb") as log:
            for _ in range(self.config.log_chunks_per_pass):
                remaining = end - record.log_read_offset
                if remaining <= 0:
                    break
                log.seek(record.log_read_offset)
                data = log.read(min(self.config.log_chunk_bytes, remaining))
                if not data:
                    return True
                # At the cap the bytes up to it go, a character split there included.
                whole = len(data) >= remaining and (final or over)
                length = len(data) if whole else utf8_complete_length(data)
                if length == 0:
                    return True
                self._queue_log(record, data[:length])
        if over and record.log_read_offset >= cap:
            self._queue_log_marker(record, cap)
            return True
        return not over and record.log_read_offset >= size

    def _queue_log_marker(self, record: JobRecord, cap: int) -> None:
        record.log_marker_queued = True
        record.log_read_offset = cap
        marker = LogChunk(
            job_id=record.job_id,
            attempt=record.attempt,
            node=self.config.node,
            offset=cap,
            data=log_truncated_marker(cap).encode(),
        )
        self.emit(marker, lambda: self._log_marker_sent(record, cap))
        logger.warning(
            "job %s attempt %s: output passed its log cap of %d bytes; no more of it is shipped",
            record.job_id,
            record.attempt,
            cap,
        )

    def _log_marker_sent(self, record: JobRecord, cap: int) -> None:
        """Remembered on disk: a restarted agent does not resume shipping."""
        record.log_truncated = True
        record.log_offset = max(record.log_offset, cap)
        self.store.save(record)

    @staticmethod
    def _trim_log(record: JobRecord, path: Path, cap: int) -> None:
        """Cut the log file back to the cap once the marker is out: nothing beyond it is
        ever read, and a job printing without end would fill the node's disk. The job
        writes in append mode, so it goes on at the new end."""
        if not record.log_truncated:
            return
        try:
            if path.stat().st_size > cap:
                os.truncate(path, cap)
        except OSError:
            pass  # gone with the workspace clean-up, or not ours to cut

    def _queue_log(self, record: JobRecord, data: bytes) -> None:
        offset = record.log_read_offset
        end = offset + len(data)
        record.log_read_offset = end
        chunk = LogChunk(
            job_id=record.job_id,
            attempt=record.attempt,
            node=self.config.node,
            offset=offset,
            data=data,
        )
        self.emit(chunk, lambda: self._log_sent(record, end))

    def _log_sent(self, record: JobRecord, end: int) -> None:
        record.log_offset = max(record.log_offset, end)
        self.store.save(record)
