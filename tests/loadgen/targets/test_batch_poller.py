"""target=http's BatchPoller: a run's engine iterations fetched in pages while it runs, none lost to the
server's bounded history and none twice."""
import httpx

from stallfree.engine.server import ServerConfig, start_server
from stallfree.loadgen.targets.batch_poller import BatchPoller


def test_polling_in_pages_keeps_every_iteration_of_a_short_lived_history():
    cfg = ServerConfig(port=0, batch_history_max_records=80)
    with start_server({"model": "tiny", "dtype": "float32"}, cfg) as server:
        poller = BatchPoller(server.url, since=0.0, interval_s=0.05, page_limit=7)
        with httpx.Client(base_url=server.url, timeout=60, trust_env=False) as client:
            for _ in range(4):  # 40 iterations each (a prefill and 39 decodes): twice what the server keeps
                body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 40, "ignore_eos": True}
                assert client.post("/v1/completions", json=body).status_code == 200
        batches = poller.stop()
    iterations = [b["iteration"] for b in batches]
    assert iterations == list(range(iterations[0], iterations[0] + len(iterations)))
    assert len(iterations) >= 4 * 40 > cfg.batch_history_max_records
    assert sum(b["num_decode_tokens"] for b in batches) >= 4 * 39
