"""The live target of a sweep: kept across runs while the server-side config (target kind and URL, or
the engine: loadgen.config.views.engine_identity) and the request shape (target.token_ids, ignore_eos, tokenizer) stay the
same, and replaced, after a short warm-up, when they change."""
from __future__ import annotations

from pathlib import Path

from stallfree.loadgen.config.schema import BenchConfig
from stallfree.loadgen.config.views import digest, engine_identity
from stallfree.loadgen.targets import Target, target_class
from stallfree.loadgen.workload.request_specs import build_workload

WARMUP_REQUESTS = 2  # short requests sent to a freshly made target, not recorded


class LiveTarget:
    """At most one open target at a time; ``close`` releases it (a server process, an engine)."""

    def __init__(self):
        self._key: str | None = None
        self._target: Target | None = None

    def get(self, cfg: BenchConfig, log_dir: Path) -> Target:
        """The run's target, reusing the open one when its server-side config is the same."""
        t = cfg.target  # the request shape is settled when a target is made: a new shape makes a new target
        key = digest([t.kind, t.url or engine_identity(cfg), t.token_ids, t.ignore_eos, t.tokenizer])
        if self._target is None or key != self._key:
            self.close()
            target = target_class(cfg.target.kind)(cfg, log_dir)
            try:
                _warm_up(target, cfg.seed)
            except BaseException:
                target.close()
                raise
            self._key, self._target = key, target
        return self._target

    def close(self) -> None:
        target, self._key, self._target = self._target, None, None
        if target is not None:
            target.close()


def _warm_up(target: Target, seed: int) -> None:
    specs = build_workload({"kind": "burst"}, {"kind": "fixed", "prompt": 16, "output": 4}, WARMUP_REQUESTS,
                           seed, target.vocab_size)
    target.replay(specs, warmup=0, progress=None)
