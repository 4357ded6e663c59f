"""FAKE fault for tests only: a runner stand-in that wraps the engine's real runner and fails every step
that holds a "poisoned" request, as the sampler once failed on a top_k too large for a float. What is
under test is the engine's isolation (engine/runner/isolation.py), not this fault.

By default a request is poisoned by its sampling seed (a legal value, so it passes every validation)
once it has ``after_tokens`` tokens in the KV cache: 0 fails its first prefill chunk, more fails it
mid-decode; ``request_ids`` poisons named requests instead. The real runner runs first, so the failed
step has written the KV cache of every request in it, as a fault in the sampler would have.
"""
from __future__ import annotations

from stallfree.engine.runner.runner_output import ModelRunnerOutput
from stallfree.engine.scheduler.output import ScheduledUnit, SchedulerOutput

POISON_SEED = 666_666


class Poisoned(RuntimeError):
    pass


class PoisonedRunner:
    def __init__(self, inner, *, seed: int = POISON_SEED, after_tokens: int = 0,
                 request_ids: set[str] | None = None):
        self.inner, self.seed, self.after_tokens, self.request_ids = inner, seed, after_tokens, request_ids
        self.calls = 0  # execute_model calls, re-runs included

    def poisoned(self, unit: ScheduledUnit) -> bool:
        if self.request_ids is not None:
            return unit.request_id in self.request_ids
        return unit.sampling_params.seed == self.seed and unit.num_computed_tokens >= self.after_tokens

    def execute_model(self, output: SchedulerOutput) -> ModelRunnerOutput:
        self.calls += 1
        sampled = self.inner.execute_model(output)
        for unit in output.units:
            if self.poisoned(unit):
                raise Poisoned(f"poisoned request {unit.request_id} at token {unit.num_computed_tokens}")
        return sampled

    def __getattr__(self, name: str):  # the rest of the real runner (its KV cache, generators, ...)
        return getattr(self.inner, name)
