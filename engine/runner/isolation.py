"""Finding the requests a failed step failed on, so that the engine ends only those.

Requests are validated one by one before they are batched (``SamplingParams.validate``,
``LLMEngine.add_request``), so a step should not raise. If one does, the engine calls
``execute_isolating``: it re-runs the step on halves of its units, and halves of the halves that fail,
until every failing unit ran alone. Each healthy half's sampled tokens are kept, so the step's other
requests lose nothing; a request whose unit fails alone is blamed, with the exception of its own run.
k failing units out of n cost at most about 2k·log2(n) extra runs, paid only after a failure.

A re-run recomputes the same tokens at the same positions and writes the same KV slots as the failed
run, so greedy requests produce exactly the tokens they would have. A fault that is not any one
request's (a device lost for good) fails every unit alone: every request is ended, as before.
"""
from __future__ import annotations

from dataclasses import replace

from stallfree.engine.runner.base import Runner, RunnerDead
from stallfree.engine.runner.runner_output import ModelRunnerOutput
from stallfree.engine.scheduler.output import ScheduledUnit, SchedulerOutput


def execute_isolating(runner: Runner, output: SchedulerOutput,
                      error: Exception) -> tuple[ModelRunnerOutput, dict[str, Exception]]:
    """``runner.execute_model(output)`` raised ``error``: what the healthy units' runs returned, and the
    exception of each request whose unit failed on its own. A runner that dies meanwhile (RunnerDead) fails
    them all: that propagates."""
    sampled = ModelRunnerOutput({})
    failed: dict[str, Exception] = {}
    pending: list[tuple[list[ScheduledUnit], Exception]] = [(output.units, error)]
    while pending:
        units, unit_error = pending.pop()
        if len(units) == 1:
            failed[units[0].request_id] = unit_error
            continue
        middle = len(units) // 2
        for half in (units[:middle], units[middle:]):  # each keeps the decodes-first order
            try:
                sampled.merge(runner.execute_model(replace(output, units=half)))
            except RunnerDead:
                raise
            except Exception as exc:
                pending.append((half, exc))
    return sampled, failed
