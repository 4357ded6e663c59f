"""SimulatedRunner: the Runner protocol with no forward pass; an iteration takes the time a cost model
fitted on the real runner's BatchRecords predicts.

Same schedulers, same KV accounting, same records. With a ``VirtualClock`` time is a counter the
runner advances (thousands of requests in seconds, offline); without one the runner sleeps (a fast
stand-in server for testing load generators).
"""
from __future__ import annotations

import random
import time

from stallfree.engine.runner.clock import VirtualClock
from stallfree.engine.runner.runner_output import ModelRunnerOutput
from stallfree.engine.scheduler.output import SchedulerOutput
from stallfree.engine.simulator.fitting.cost_model import CostModel, IterationFeatures


class SimulatedRunner:
    reads_block_tables = False
    computes_logits = False

    def __init__(self, cost_model: CostModel, vocab_size: int, eos_token_ids: set[int], clock: VirtualClock | None,
                 seed: int):
        self.cost_model, self.clock = cost_model, clock
        # Sampled ids avoid EOS, so every request runs to its max_tokens as the workload specified.
        self.token_ids = [t for t in range(vocab_size) if t not in eos_token_ids]
        self.rng = random.Random(seed)

    def shutdown(self) -> None:
        pass  # one process: nothing to stop (a distributed runner stops its workers)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        out = scheduler_output
        seconds = self.cost_model.sample(IterationFeatures.of(out), self.rng)
        if self.clock is None:
            time.sleep(seconds)
        else:
            self.clock.advance_by(seconds)
        token_ids, randrange = self.token_ids, self.rng.randrange
        return ModelRunnerOutput({u.request_id: token_ids[randrange(len(token_ids))] for u in out.units if u.samples})
