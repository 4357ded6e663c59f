"""``ModelRunnerOutput``: what a runner hands back for one iteration, the one record the engine reads of it."""
from __future__ import annotations

from dataclasses import dataclass, field

from stallfree.engine.request import TokenLogprob
from stallfree.engine.utilization import OperatorSplit


@dataclass
class ModelRunnerOutput:
    # The sampled token id of every unit that samples (it completes its request's scheduled tokens), by request id.
    sampled_token_ids: dict[str, int]
    # The sampled token's logprobs, for the requests whose sampling params ask (``logprobs``), by request id.
    sample_logprobs: dict[str, TokenLogprob] = field(default_factory=dict)
    # The logprobs of the prompt positions this iteration computed (``prompt_logprobs``): each request's
    # next rows, by request id.
    prompt_logprobs: dict[str, list[TokenLogprob]] = field(default_factory=dict)
    # The CPU threads the iteration ran with; 0 on a GPU or in a simulation.
    cpu_threads: int = 0
    # The iteration's seconds in linear layers and in attention, when the runner timed it (``op_split_every``).
    operator_split: OperatorSplit | None = None
    # A pipeline's stages (one entry each): each stage's busy seconds on this micro-batch, its idle seconds
    # (bubble) right before it, and the part of those it spent taking the micro-batch once the micro-batch was
    # sent and the stage free (0 on stage 0); empty for a runner with no stages.
    stage_busy_s: list[float] = field(default_factory=list)
    stage_idle_s: list[float] = field(default_factory=list)
    stage_handoff_s: list[float] = field(default_factory=list)

    def merge(self, other: ModelRunnerOutput) -> None:
        """Add the results of a run over other units of the same iteration (engine/runner/isolation.py)."""
        self.sampled_token_ids |= other.sampled_token_ids
        self.sample_logprobs |= other.sample_logprobs
        self.prompt_logprobs |= other.prompt_logprobs
        self.cpu_threads = max(self.cpu_threads, other.cpu_threads)
