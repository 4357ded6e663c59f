"""The server's engine iterations, fetched during a run: GET /stallfree/batches in pages every few
seconds from a thread, so that no single fetch is large (a whole run's history at the end took seconds
and stalled the server's streams) and nothing is lost to the server's bounded retention."""
from __future__ import annotations

import threading

import httpx

from stallfree.engine.records import BatchRecord, BatchSchemaError, decode_batch

PAGE_LIMIT = 2000  # records per request
POLL_INTERVAL_S = 2.0


class BatchPoller:
    """Collects the BatchRecords that started at or after ``since``, until ``stop()``."""

    def __init__(self, url: str, since: float, interval_s: float = POLL_INTERVAL_S, page_limit: int = PAGE_LIMIT):
        self.url, self.since, self.interval_s, self.page_limit = url, since, interval_s, page_limit
        self.batches: list[BatchRecord] = []
        self._last_iteration = -1
        self._stopping = threading.Event()
        self._client = httpx.Client(timeout=60, trust_env=False)
        self._thread = threading.Thread(target=self._run, name="batch-poller", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.wait(self.interval_s):
            try:
                self.fetch()
            except httpx.HTTPError:
                pass  # a busy or restarting server: the next poll (or the final fetch) catches up
            except BatchSchemaError:
                return  # rows of another schema: the final fetch raises it where the run can report it

    def fetch(self) -> None:
        """Every page from the last record seen to the newest."""
        since: float | None = self.since
        while since is not None:
            response = self._client.get(f"{self.url}/stallfree/batches",
                                        params={"since": since, "limit": self.page_limit})
            response.raise_for_status()
            page = response.json()
            source = f"{self.url}/stallfree/batches"
            rows = [decode_batch(row, source) for row in page["batches"]]
            # A page starts at a start time, which the last page's final record may share: skip those.
            new_batches = [batch for batch in rows if batch.iteration > self._last_iteration]
            if new_batches:
                self.batches.extend(new_batches)
                last = new_batches[-1]
                self._last_iteration, self.since = last.iteration, last.start_time
            since = page["next_since"]

    def stop(self) -> list[BatchRecord]:
        """Stop polling, fetch what is left and return every record collected."""
        self._stopping.set()
        self._thread.join()
        try:
            self.fetch()
        finally:
            self._client.close()
        return self.batches
