"""Targets that replay open loop over HTTP (loadgen.openai_client.openloop) on an OpenAI-compatible server:
``target=url``, a server already running, and ``target=http``, a ``stallfree-serve`` started for the
run, whose engine iterations are recorded too (batches.parquet). Both scrape the server's /metrics
during every replay (loadgen.targets.server_metrics).

Each request's shape is settled once, when the target is made (loadgen.targets.server_check.probe_request_shape):
text prompts unless token ids are asked for and taken (a spec without text gets one of its prompt length,
loadgen.workload.request_specs.with_text_prompts), ``ignore_eos`` only where the server takes it."""
from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from pathlib import Path

from stallfree.engine.records import RequestRecord
from stallfree.loadgen.config.schema import BenchConfig
from stallfree.loadgen.config.views import model_vocab_size, prompt_tokenizer_dir
from stallfree.loadgen.openai_client.openloop import run_open_loop_sync
from stallfree.loadgen.targets.base import TARGETS, Progress, Replay, RequestShape
from stallfree.loadgen.targets.batch_poller import BatchPoller
from stallfree.loadgen.targets.serve_process import ServeProcess
from stallfree.loadgen.targets.server_check import describe_server, probe_request_shape, reset_prefix_cache
from stallfree.loadgen.targets.server_metrics import MetricsScraper
from stallfree.loadgen.workload.request_specs import RequestSpec, with_text_prompts
from stallfree.loadgen.workload.text_prompts import LengthTexts, load_tokenizer


def settled_shape(cfg: BenchConfig, url: str, served_model: str) -> tuple[RequestShape, LengthTexts | None]:
    """The request shape ``url`` takes (``target.token_ids`` / ``target.ignore_eos``, ``auto`` probed) and,
    for text prompts, what writes them."""
    shape = probe_request_shape(url, served_model, cfg.target.switch("token_ids"), cfg.target.switch("ignore_eos"))
    return shape, None if shape.token_ids else LengthTexts(load_tokenizer(prompt_tokenizer_dir(cfg)))


class _OpenLoopHttpTarget:
    """Sends to ``self.url`` (set by the subclass, which settles ``shape``) with ``served_model`` as each
    request's "model"."""

    url: str
    engine_pid: int | None = None  # a server elsewhere: its CPU is not measured
    client_nice = 0  # a server elsewhere may not share our CPUs: nothing to give way to
    engine_label: str | None = None  # a server the bench did not start: what it says it is
    request_shape: RequestShape
    texts: LengthTexts | None  # writes the text prompts of specs without text (None: token ids are sent)

    def __init__(self, cfg: BenchConfig, served_model: str):
        self.served_model = served_model
        self.vocab_size = model_vocab_size(cfg)
        self.max_in_flight, self.timeout_s = cfg.arrival.max_concurrency, cfg.target.timeout_s
        self.endpoint = cfg.target.endpoint
        self.metrics_interval_s = cfg.target.metrics_interval_s

    def send(self, specs: Sequence[RequestSpec], *, warmup: int, progress: Progress | None) -> list[RequestRecord]:
        if self.texts is not None:
            specs = with_text_prompts(specs, self.texts)
        return run_open_loop_sync(self.url, specs, model=self.served_model, max_in_flight=self.max_in_flight,
                                  timeout_s=self.timeout_s, warmup=warmup, progress=progress,
                                  endpoint=self.endpoint, ignore_eos=self.request_shape.ignore_eos,
                                  nice=self.client_nice)

    def replay(self, specs: Sequence[RequestSpec], *, warmup: int, progress: Progress | None) -> Replay:
        reset = reset_prefix_cache(self.url)
        with MetricsScraper(self.url, self.metrics_interval_s) as scraper:
            replay = self.send_recorded(specs, warmup=warmup, progress=progress)
        replay.server_metrics, replay.prefix_cache_reset = scraper.result, reset
        return replay

    def send_recorded(self, specs: Sequence[RequestSpec], *, warmup: int, progress: Progress | None) -> Replay:
        """``send``, with what else the target records of the replay."""
        return Replay(self.send(specs, warmup=warmup, progress=progress), None)

    def finalize(self, run_dir: Path) -> None:
        pass

    def close(self) -> None:
        pass


@TARGETS.register("url")
class UrlTarget(_OpenLoopHttpTarget):
    """target=url: the running server at ``target.url``."""

    def __init__(self, cfg: BenchConfig, log_dir: Path):
        self.url = cfg.target.url.rstrip("/")
        server = describe_server(self.url, cfg.target.served_model)
        super().__init__(cfg, server.served_model)
        self.engine_label = cfg.target.label or server.label
        self.request_shape, self.texts = settled_shape(cfg, self.url, self.served_model)


@TARGETS.register("http")
class HttpTarget(_OpenLoopHttpTarget):
    """target=http: a stallfree-serve of the run's server-side config, stopped by ``close``."""

    def __init__(self, cfg: BenchConfig, log_dir: Path):
        super().__init__(cfg, cfg.model.model)
        self._resources = contextlib.ExitStack()
        self.server = self._resources.enter_context(ServeProcess(cfg, log_dir))
        self.url, self.engine_pid = self.server.url, self.server.process.pid
        self.client_nice = cfg.target.client_nice  # the engine shares our CPUs: the client gives way to it
        try:
            self.request_shape, self.texts = settled_shape(cfg, self.url, self.served_model)
        except BaseException:
            self.close()
            raise

    def send_recorded(self, specs: Sequence[RequestSpec], *, warmup: int, progress: Progress | None) -> Replay:
        poller = BatchPoller(self.url, since=time.time())
        try:
            records = self.send(specs, warmup=warmup, progress=progress)
        finally:
            batches = poller.stop()
        return Replay(records, batches)

    def close(self) -> None:
        self._resources.close()
