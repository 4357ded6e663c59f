"""A pipeline stage's worker loop: take each micro-batch's ticket from the driver, the previous stage's hidden
states, run this rank's layers, and hand the result on (the last stage: sample and post the tokens, with every
stage's busy, idle and hand-off seconds, to the driver), until the driver posts a stop. Any failure ends the
worker, which the driver sees."""
from __future__ import annotations

import time

from stallfree.engine.distributed.channel import DRIVER
from stallfree.engine.distributed.layout import RankLayout
from stallfree.engine.distributed.mailbox import Mailbox
from stallfree.engine.distributed.stage_link import StageLink, StageTimer, Ticket
from stallfree.engine.runner.model_runner import ModelRunner


def stage_link(layout: RankLayout, rank: int, runner: ModelRunner, hidden_size: int) -> StageLink:
    """``rank``'s links: to the ranks of the same tensor-parallel shard in the stages before and after it."""
    stage, tp, last = layout.pp_rank(rank), layout.tensor_parallel_size, layout.pipeline_parallel_size - 1
    return StageLink(hidden_size, runner.dtype, runner.device, rank - tp if stage else None,
                     rank + tp if stage < last else None, layout.pipeline_parallel_size)


def serve_stage(runner: ModelRunner, layout: RankLayout, rank: int, mailbox: Mailbox, hidden_size: int) -> None:
    stage = layout.pp_rank(rank)
    last = stage == layout.pipeline_parallel_size - 1
    samples = last and layout.tp_rank(rank) == 0  # the other ranks of a tensor-parallel last stage only join in
    link, timer = stage_link(layout, rank, runner, hidden_size), StageTimer()
    while True:
        ticket: Ticket | None = mailbox.take()
        if ticket is None:  # the driver stops
            return
        output = ticket.scheduler_output
        hidden, timings, sent_s = None, [], None
        if stage:  # three timings a stage before it, then when the previous stage sent the micro-batch
            hidden, received = link.receive(sum(len(u.token_ids) for u in output.units), 3 * stage + 1)
            timings, sent_s = received[:-1], received[-1]
        start = time.time()
        if samples:
            result = runner.execute_model(output, hidden)
        else:
            hidden = runner.execute_forward(output, hidden)
        end = time.time()
        timings += timer.time(start, end, ticket.period_start_s, sent_s)
        if samples:
            result.stage_busy_s, result.stage_idle_s, result.stage_handoff_s = (timings[0::3], timings[1::3],
                                                                                timings[2::3])
            mailbox.post(DRIVER, result)
        elif not last:
            link.send(hidden, [*timings, end])
