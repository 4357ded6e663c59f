"""target=http's BatchPoller: a run's engine iterations fetched in pages while it runs, none lost to the
server's bounded history and none twice."""
import dataclasses
import http.server
import json
import threading
import time

import httpx
import pytest

from stallfree.engine.records import BatchSchemaError
from stallfree.engine.server import ServerConfig, start_server
from stallfree.loadgen.targets.batch_poller import BatchPoller
from tests.helpers.batch_records import example_batch_record


def test_polling_in_pages_keeps_every_iteration_of_a_short_lived_history():
    cfg = ServerConfig(port=0, batch_history_max_records=80)
    with start_server({"model": "tiny", "dtype": "float32"}, cfg) as server:
        poller = BatchPoller(server.url, since=0.0, interval_s=0.05, page_limit=7)
        with httpx.Client(base_url=server.url, timeout=60, trust_env=False) as client:
            for _ in range(4):  # 40 iterations each (a prefill and 39 decodes): twice what the server keeps
                body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 40, "ignore_eos": True}
                assert client.post("/v1/completions", json=body).status_code == 200
                # room for the poller between requests: on a loaded machine (the whole suite) it fell more than
                # the history's 80 iterations behind within one burst
                time.sleep(0.3)
        batches = poller.stop()
    iterations = [b.iteration for b in batches]
    assert iterations == list(range(iterations[0], iterations[0] + len(iterations)))
    assert len(iterations) >= 4 * 40 > cfg.batch_history_max_records
    assert sum(b.num_decode_tokens for b in batches) >= 4 * 39


class _FakeOldServer(http.server.BaseHTTPRequestHandler):
    """FAKE: a server whose batch rows have a field under another name (a server of another version)."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        row = dataclasses.asdict(example_batch_record())
        row["prefill_tokens"] = row.pop("num_prefill_tokens")
        body = json.dumps({"batches": [row], "next_since": None}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_rows_of_another_schema_are_an_error_naming_the_columns():
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeOldServer) as fake:
        threading.Thread(target=fake.serve_forever, daemon=True).start()
        poller = BatchPoller(f"http://127.0.0.1:{fake.server_port}", since=0.0, interval_s=0.05)
        time.sleep(0.2)  # the polling thread meets the rows first, and stops polling
        with pytest.raises(BatchSchemaError, match="unknown column.s. prefill_tokens; missing column.s. num_prefill_tokens"):
            poller.stop()
        fake.shutdown()
