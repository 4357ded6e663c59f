"""``target=locust``: the run's requests are sent by a headless Locust run (loadgen/locust/locustfile.py,
OpenLoopUser) against a ``stallfree-serve`` the bench starts (``target.url: null``, as for target=http)
or a running server (``target.url``).

Locust gets the run's exact requests (``--specs-file``; with ``target.workers`` > 1 one master and that
many worker processes, worker i sending every W-th request) and ends once all of them have ended. Its
records become requests.parquet / summary.json as for the other targets, and the server's /metrics is
scraped meanwhile as for target=http / url (loadgen.targets.server_metrics); its own outputs (CSV, HTML
report, log, raw records) go to ``<run_dir>/locust/``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from stallfree.engine.records import RequestRecord
from stallfree.loadgen.config.schema import BenchConfig
from stallfree.loadgen.config.views import model_vocab_size
from stallfree.loadgen.targets.base import TARGETS, Progress, Replay
from stallfree.loadgen.targets.openai_server import settled_shape
from stallfree.loadgen.targets.serve_process import ServeProcess
from stallfree.loadgen.targets.server_check import describe_server, reset_prefix_cache
from stallfree.loadgen.targets.server_metrics import MetricsScraper
from stallfree.loadgen.workload.request_specs import RequestSpec, with_text_prompts

LOCUSTFILE = Path(__file__).resolve().with_name("locustfile.py")
OUTPUT_DIR = "locust"  # Locust's outputs, in the run directory


def read_records(rows_dir: Path) -> list[RequestRecord]:
    """The records every process of a Locust run wrote to rows_dir (``--rows-dir``)."""
    return [RequestRecord(**json.loads(line)) for path in sorted(Path(rows_dir).glob("rows-*.jsonl"))
            for line in path.read_text().splitlines()]


def run_locust(url: str, specs: Sequence[RequestSpec], out_dir: Path, *, model: str, workers: int = 1,
               timeout_s: float = 600.0, max_in_flight: int | None = None,
               endpoint: str = "completions", ignore_eos: bool = True) -> list[RequestRecord]:
    """Send ``specs`` open loop with a headless Locust run; return one record per spec, in order.

    out_dir receives specs.jsonl, rows/, Locust's locust_*.csv and locust.html, and locust.log.
    ``max_in_flight`` caps each Locust process; arrivals over it are dropped (status aborted).
    Raises RuntimeError when Locust fails or a request ends without a record.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    specs_file = out_dir / "specs.jsonl"
    specs_file.write_text("".join(json.dumps(dataclasses.asdict(spec)) + "\n" for spec in specs))
    # the run ends by itself once every request has ended; --run-time is only a safety net
    run_time = math.ceil(max(spec.send_offset_s for spec in specs) + timeout_s + 60)
    exe = Path(sys.executable).with_name("locust")
    command = [str(exe) if exe.exists() else "locust", "-f", str(LOCUSTFILE), "OpenLoopUser", "--headless",
               "--host", url, "--users", str(workers), "--spawn-rate", str(workers), "--run-time", f"{run_time}s",
               "--specs-file", str(specs_file), "--rows-dir", str(out_dir / "rows"), "--model", model,
               "--endpoint", endpoint, *([] if ignore_eos else ["--no-ignore-eos"]),
               "--request-timeout", str(timeout_s), "--max-in-flight", str(max_in_flight or 0),
               "--csv", str(out_dir / "locust"), "--html", str(out_dir / "locust.html"),
               "--only-summary", "--exit-code-on-error", "0"]
    if workers > 1:
        command += ["--processes", str(workers)]
    log_path = out_dir / "locust.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            returncode = proc.wait(timeout=run_time + 120)
        finally:
            if proc.poll() is None:  # timed out or interrupted: stop the master and its workers
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    records = {record.request_id: record for record in read_records(out_dir / "rows")}
    missing = sum(spec.request_id not in records for spec in specs)
    if returncode or missing:
        raise RuntimeError(f"locust exited with status {returncode}, {missing} of {len(specs)} requests "
                           f"without a record (log: {log_path})")
    return [records[spec.request_id] for spec in specs]


@TARGETS.register("locust")
class LocustTarget:
    """target=locust (see the module docstring)."""

    client_nice = 0  # Locust's processes run at this process's nice value

    def __init__(self, cfg: BenchConfig, log_dir: Path):
        t = cfg.target
        self.vocab_size = model_vocab_size(cfg)
        self._resources = contextlib.ExitStack()
        self.engine_label = None
        if t.url is None:
            server = self._resources.enter_context(ServeProcess(cfg, log_dir))
            self.url, self.served_model, self.engine_pid = server.url, cfg.model.model, server.process.pid
        else:
            self.url, self.engine_pid = t.url.rstrip("/"), None
            described = describe_server(self.url, t.served_model)
            self.served_model, self.engine_label = described.served_model, t.label or described.label
        try:
            self.request_shape, self.texts = settled_shape(cfg, self.url, self.served_model)
        except BaseException:
            self._resources.close()
            raise
        self.workers, self.timeout_s, self.max_in_flight = t.workers, t.timeout_s, t.max_in_flight
        self.endpoint, self.metrics_interval_s = t.endpoint, t.metrics_interval_s
        self.work_dir = log_dir / "locust"
        self.output: Path | None = None  # the last replay's outputs, until finalize claims them

    def replay(self, specs: Sequence[RequestSpec], *, warmup: int, progress: Progress | None) -> Replay:
        if self.output is not None:  # a warm-up or probe replay's, never claimed
            shutil.rmtree(self.output, ignore_errors=True)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.output = Path(tempfile.mkdtemp(prefix="run-", dir=self.work_dir))
        if self.texts is not None:
            specs = with_text_prompts(specs, self.texts)
        reset = reset_prefix_cache(self.url)
        with MetricsScraper(self.url, self.metrics_interval_s) as scraper:
            records = run_locust(self.url, specs, self.output, model=self.served_model, workers=self.workers,
                                 timeout_s=self.timeout_s, max_in_flight=self.max_in_flight,
                                 endpoint=self.endpoint, ignore_eos=self.request_shape.ignore_eos)
        for i, record in enumerate(records):
            record.is_warmup = i < warmup
            if progress is not None:
                progress(record)
        return Replay(records, None, scraper.result, prefix_cache_reset=reset)

    def finalize(self, run_dir: Path) -> None:
        """Move the last replay's Locust outputs into ``run_dir/locust/``."""
        shutil.rmtree(run_dir / OUTPUT_DIR, ignore_errors=True)
        shutil.move(self.output, run_dir / OUTPUT_DIR)
        self.output = None

    def close(self) -> None:
        self._resources.close()
