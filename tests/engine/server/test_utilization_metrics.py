"""/metrics carries each iteration's MFU and MBU (histograms), and GET /stallfree/batches the record fields."""
from __future__ import annotations

from tests.helpers.server import metric, wait_idle


def test_iteration_utilisation_series(server, http):
    before = wait_idle(server.url)
    body = {"prompt": [5] * 40, "max_tokens": 6, "ignore_eos": True, "temperature": 0.0}
    assert http.post("/v1/completions", json=body).status_code == 200
    after = wait_idle(server.url)

    def delta(name):
        return metric(after, name, model_name="tiny") - metric(before, name, model_name="tiny")

    iterations = delta("stallfree:iterations_total")
    assert iterations >= 6
    for series in ("stallfree:iteration_mfu", "stallfree:iteration_mbu"):
        assert delta(f"{series}_count") == iterations
        assert 0 < delta(f"{series}_sum") / iterations < 1
    batches = http.get("/stallfree/batches").json()["batches"]
    assert all(b["mfu"] > 0 and b["model_flops"] > 0 and b["bytes_moved"] > 0 for b in batches)
