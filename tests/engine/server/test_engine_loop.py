"""EngineLoop: one iteration's tokens reach every submission's queue, and a submission whose event loop has
closed ends its engine requests instead of being stepped forever."""
import asyncio
import time

from stallfree.engine import LLMEngine, SamplingParams
from stallfree.engine.server.history import BatchHistory
from stallfree.engine.server.loop import EngineLoop
from stallfree.engine.server.metrics import ServerMetrics


def started_loop() -> EngineLoop:
    loop = EngineLoop(lambda: LLMEngine.from_kwargs(model="tiny", dtype="float32", num_blocks=64), max_waiting=8,
                      history=BatchHistory(10_000, 600.0))
    loop.start(ServerMetrics("tiny", loop.engine.max_model_len))
    return loop


def wait_for(condition, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_the_submissions_of_one_iteration_all_get_their_tokens():
    engine_loop = started_loop()
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)

    async def one(prompt: list[int]) -> list[int]:
        sub = await engine_loop.submit([prompt], [params], f"r{prompt[0]}", time.time())
        tokens: list[int] = []
        while len(tokens) < 3:
            for _, out in await sub.queue.get():
                tokens += out.new_token_ids
        return tokens

    async def all_of_them() -> list[list[int]]:  # a lost delivery times out instead of hanging the run
        return await asyncio.gather(*(one([i, 5, 6, 7]) for i in range(1, 5)))

    try:
        assert [len(tokens) for tokens in asyncio.run(asyncio.wait_for(all_of_them(), 60))] == [3, 3, 3, 3]
    finally:
        engine_loop.stop()


def test_a_submission_whose_event_loop_closed_ends_its_requests():
    engine_loop = started_loop()
    params = SamplingParams(max_tokens=1000, temperature=0.0, ignore_eos=True)
    event_loop = asyncio.new_event_loop()
    try:
        event_loop.run_until_complete(engine_loop.submit([[1, 2, 3]], [params], "gone", time.time()))
        event_loop.close()  # its client is gone without a word
        assert wait_for(lambda: not engine_loop._routes)
        assert engine_loop.alive
        time.sleep(0.2)  # an iteration still under way when the request was aborted
        assert len(engine_loop.history) < 10  # ended at its first tokens, not after 1,000 iterations
    finally:
        engine_loop.stop()
