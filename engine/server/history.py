"""The engine's recent iterations for ``GET /stallfree/batches``: bounded in count and in age, read in
pages. Each record is encoded to JSON once, when the engine thread adds it (tens of microseconds, a
few hundred times a second at most), so a fetch only joins bytes: encoding 50,000 records per fetch
took seconds of CPU and GIL time that the event loop and the engine thread needed."""
from __future__ import annotations

import bisect
import json
import threading
from collections import deque
from collections.abc import Iterator

from stallfree.engine.records import BatchRecord, encode_batch

# Records per piece of a fetch's response (about 0.6 MB).
JOIN_SLICE = 2000


class BatchHistory:
    """Filled by the engine thread, read by worker threads: (start time, record as JSON) pairs, at most
    ``max_records``, none that started more than ``max_age_s`` before the newest ended."""

    def __init__(self, max_records: int, max_age_s: float):
        self.max_age_s = max_age_s
        self._records: deque[tuple[float, bytes]] = deque(maxlen=max_records)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._records)

    def extend(self, records: list[BatchRecord]) -> None:
        if not records:
            return
        encoded = [(r.start_time, encode_batch(r)) for r in records]
        horizon = records[-1].end_time - self.max_age_s
        with self._lock:
            self._records.extend(encoded)
            while self._records[0][0] < horizon:
                self._records.popleft()

    def page(self, since: float, limit: int | None = None) -> tuple[list[bytes], float | None]:
        """Up to ``limit`` records (all: None) that started at or after ``since``, oldest first, as JSON,
        and the ``since`` of the next page (None when this page reaches the newest record)."""
        with self._lock:
            rows = list(self._records)  # a copy of references: the engine thread waits a millisecond at most
        start = bisect.bisect_left(rows, since, key=lambda row: row[0])
        end = len(rows) if limit is None else min(len(rows), start + limit)
        return [row[1] for row in rows[start:end]], rows[end][0] if end < len(rows) else None

    def page_json(self, since: float, limit: int | None = None) -> Iterator[bytes]:
        """``{"batches": [...], "next_since": ...}`` in pieces of JOIN_SLICE records, for a
        StreamingResponse: it writes each piece as it comes (a sync iterator runs on worker threads),
        where one 15 MB write held the event loop for tens of milliseconds."""
        records, next_since = self.page(since, limit)
        yield b'{"batches":['
        for i in range(0, len(records), JOIN_SLICE):
            yield (b"," if i else b"") + b",".join(records[i:i + JOIN_SLICE])
        yield b'],"next_since":' + json.dumps(next_since).encode() + b"}"
