"""Serving jobs on this node: their ports, and the scrapes of their health and metrics
endpoints (part of the node agent's
:class:`~scheduling.agent.executor.LocalProcessExecutor`). The scrapes run in the
scraper's threads (:mod:`scheduling.agent.serving`): nothing here waits on a replica."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from scheduling.agent.config import AgentConfig
from scheduling.agent.jobstore import JobStore
from scheduling.agent.runner import JobRecord, LaunchError
from scheduling.agent.serving import PortPicker, ServeScraper, ServeTarget
from scheduling.executors.base import ServeSamples

logger = logging.getLogger(__name__)


class ServingScrapes:
    """Ports for serving jobs, and one scrape round of their endpoints at a time."""

    def __init__(
        self, config: AgentConfig, store: JobStore, *, on_round_done: Callable[[], None]
    ) -> None:
        self.config = config
        self.store = store
        self.ports = PortPicker(*config.serve_ports)
        self.scraper = ServeScraper(timeout=config.serve_scrape_timeout, on_done=on_round_done)
        self.next_scrape = 0.0

    def pick_port(self, record: JobRecord) -> int:
        """A free port of ``serve_ports`` for a serving job, none of another's here."""
        taken = {r.port for r in self.store.running() if r.port and r is not record}
        port = self.ports.pick(taken)
        if port is None:
            low, high = self.config.serve_ports
            raise LaunchError(f"no free port for the serving job in --serve-ports {low}-{high}")
        return port

    def targets(self) -> list[ServeTarget]:
        """The serving jobs whose command runs (not those still starting, or ended)."""
        return [
            ServeTarget(
                job_id=r.job_id,
                attempt=r.attempt,
                port=r.port,
                health_path=r.serve.get("health_path", "/health"),
                metrics_path=r.serve.get("metrics_path", "/metrics"),
            )
            for r in self.store.running()
            if r.serve is not None and r.port is not None and r.starting is None
        ]

    def scrape(self) -> ServeSamples | None:
        """The samples of a finished scrape round (of jobs still running), if any; starts
        the next round when it is due and a serving job runs."""
        samples = self.scraper.take_results()
        if samples:
            running = {r.key for r in self.store.running()}
            samples = [s for s in samples if (s["job_id"], s["attempt"]) in running]
        now = time.monotonic()
        if not self.scraper.in_flight and now >= self.next_scrape:
            targets = self.targets()
            if targets and self.scraper.start_round(targets):
                self.next_scrape = now + self.config.serve_scrape_seconds
        return ServeSamples(node=self.config.node, samples=samples) if samples else None

    def due_in(self) -> float | None:
        """Seconds until the loop must look at the scrapes (None: nothing to scrape)."""
        if self.scraper.in_flight:
            # Its end wakes the loop; this only bounds the wait should that be missed.
            return 2 * self.config.serve_scrape_timeout + 0.1
        if self.targets():
            return self.next_scrape - time.monotonic()
        return None

    def close(self) -> None:
        self.scraper.close()
