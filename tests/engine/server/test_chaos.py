"""Chaos: well-formed greedy streams run while a hostile client sends hundreds of generated bad requests
(hypothesis strategies over every field, tests/helpers/hostile.py), requests with bad X-Request-Id
headers, and well-formed requests the engine's runner fails on (tests/helpers/fakes/poisoned_runner.py), all
concurrently against a real server on 127.0.0.1.

Every good stream completes with the tokens of a clean run; every schema-refusable request gets a 4xx
naming its field; every poisoned request gets a 500 naming its own cause; afterwards nothing runs or
waits, every KV block is free and the process's memory is back near where it was.
"""
from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.fakes.poisoned_runner import POISON_SEED
from tests.helpers.hostile import VALID_CHAT, VALID_COMPLETION, hostile_requests
from tests.helpers.server import async_client, is_openai_error, stream_tokens, wait_idle

BATCHES, PER_BATCH = 22, 25  # hostile requests: 550
FINISHED = "vllm:request_success_total"
CHAOS = settings(max_examples=BATCHES, deadline=None, derandomize=True, database=None,
                 suppress_health_check=list(HealthCheck))


def good_bodies(n: int = 4) -> list[dict]:
    rng = random.Random(11)
    return [{"prompt": [rng.randrange(3, 2048) for _ in range(rng.randint(20, 120))], "max_tokens": 24,
             "temperature": 0, "ignore_eos": True, "stream": True} for _ in range(n)]


@dataclass
class GoodLanes:
    """One lane per good body, each streaming it again and again on its own thread's event loop until
    stopped; ``in_flight`` counts the streams open right now."""

    url: str
    bodies: list[dict]
    results: list[tuple[int, list[int]]] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    in_flight: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self):
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _lane(self, client, i: int) -> None:
        while not self.stop.is_set():
            self.in_flight += 1
            try:
                self.results.append((i, await stream_tokens(client, self.bodies[i])))
            except BaseException as exc:  # reported by the test
                self.errors.append(exc)
                return
            finally:
                self.in_flight -= 1

    async def _run(self) -> None:
        async with async_client(self.url) as client:
            await asyncio.gather(*(self._lane(client, i) for i in range(len(self.bodies))))


@dataclass
class Outcome:
    kind: str  # body | header | poison
    bad: set[str]  # the bad fields (body), or the request id (poison)
    status: int
    body: str
    interleaved: bool  # good streams were in flight when it was sent


poisoned = st.builds(lambda stream, n: {**VALID_COMPLETION, "prompt": [5 + n] * (3 + n), "seed": POISON_SEED,
                                        "temperature": 0, "stream": stream}, st.booleans(), st.integers(0, 40))
bad_ids = st.sampled_from([b"x" * 129, b"id-\xff", "é".encode("latin-1") * 3]) | \
    st.integers(129, 4000).map(lambda n: b"r" * n)
KINDS = {"body": hostile_requests.map(lambda path_body: ("body", *path_body)),
         "poison": poisoned.map(lambda body: ("poison", "/v1/completions", body)),
         "header": bad_ids.map(lambda rid: ("header", "/v1/completions", {**VALID_COMPLETION, "_id": rid}))}
hostile = st.sampled_from(["body"] * 12 + ["header"] * 3 + ["poison"]).flatmap(KINDS.__getitem__)


async def send(client, lanes: GoodLanes, kind: str, path: str, body: dict, n: int) -> Outcome:
    headers = {"Content-Type": "application/json"}
    if kind == "header":
        headers["X-Request-Id"] = body.pop("_id")
    elif kind == "poison":
        headers["X-Request-Id"] = f"poison-{n}"
    valid = VALID_CHAT if path == "/v1/chat/completions" else VALID_COMPLETION
    bad = {headers["X-Request-Id"]} if kind == "poison" else {k for k in body if k not in valid or body[k] != valid[k]}
    content = json.dumps(body).encode("utf-8", "surrogatepass")
    interleaved = lanes.in_flight > 0
    async with client.stream("POST", path, content=content, headers=headers) as r:
        text = (await r.aread()).decode()
    return Outcome(kind, bad, r.status_code, text, interleaved)


def check(o: Outcome) -> None:
    """A hostile request's answer: a 4xx naming one of its bad fields, or a 500 naming its own cause."""
    bad = o.bad
    if o.kind == "poison":
        (rid,) = bad
        if o.status == 200:  # a stream: the error arrives as its last event
            events = [line[6:] for line in o.body.splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]", o.body[:500]
            error = json.loads(events[-2])
        else:
            assert o.status == 500, o.body[:500]
            error = json.loads(o.body)
        assert error["error"]["code"] == "engine_error", error
        assert f"Poisoned: poisoned request {rid}-0-" in error["error"]["message"], error
        return
    assert 400 <= o.status < 500, (o.status, bad, o.body[:500])
    error = json.loads(o.body)
    assert is_openai_error(error), o.body[:500]
    param = error["error"]["param"]
    if o.kind == "header":
        assert (o.status, param, error["error"]["code"]) == (400, "X-Request-Id", "invalid_request_id")
    elif o.status == 413:
        assert error["error"]["code"] == "request_too_large"
    elif error["error"]["code"] == "context_length_exceeded":  # a prompt or max_tokens too long
        assert bad & {"prompt", "max_tokens", "max_completion_tokens"}, (bad, error)
    else:
        assert param is not None and param.split("[")[0].split(".")[0] in bad, (bad, error)


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


@pytest.mark.slow
def test_hostile_traffic_harms_no_well_formed_stream(poisoned_server):
    url, engine = poisoned_server.url, poisoned_server.state.engine_loop.engine
    bodies = good_bodies()

    async def clean_run() -> list[list[int]]:
        async with async_client(url) as client:
            return list(await asyncio.gather(*(stream_tokens(client, b) for b in bodies)))

    reference = asyncio.run(clean_run())
    assert all(len(tokens) == 24 for tokens in reference)
    wait_idle(url)
    rss_idle = rss_mib()
    lanes = GoodLanes(url, bodies)
    outcomes: list[Outcome] = []
    lanes.thread.start()
    while lanes.in_flight == 0 and not lanes.errors:  # the good streams are open before the first attack
        time.sleep(0.01)
    start = time.monotonic()

    @CHAOS
    @given(batch=st.lists(hostile, min_size=PER_BATCH, max_size=PER_BATCH))
    def hostile_batch(batch):
        async def fire():
            async with async_client(url) as client:
                sent = [send(client, lanes, kind, path, dict(body), len(outcomes) + i)
                        for i, (kind, path, body) in enumerate(batch)]
                return await asyncio.gather(*sent)

        outcomes.extend(asyncio.run(fire()))

    try:
        hostile_batch()
    finally:
        lanes.stop.set()
        lanes.thread.join(60)
    elapsed = time.monotonic() - start
    assert not lanes.errors, lanes.errors[:3]
    harmed = [(i, tokens) for i, tokens in lanes.results if tokens != reference[i]]
    assert not harmed and len(lanes.results) >= 2 * len(bodies)
    assert len(outcomes) >= 500 and sum(o.interleaved for o in outcomes) >= 500
    for outcome in outcomes:
        check(outcome)
    kinds = {kind: sum(o.kind == kind for o in outcomes) for kind in ("body", "header", "poison")}
    assert min(kinds.values()) >= 10, kinds
    m = wait_idle(url)
    assert not engine.has_unfinished() and engine.num_free_blocks == engine.num_total_blocks
    assert not poisoned_server.state.engine_loop._routes  # every submission was routed to its end
    print(f"chaos: {len(outcomes)} hostile ({kinds}), {len(lanes.results)} good streams in {elapsed:.1f} s; "
          f"RSS {rss_idle:.0f} -> {rss_mib():.0f} MiB; finished by reason: "
          f"{ {dict(labels)['finished_reason']: v for (name, labels), v in m.items() if name == FINISHED} }")
    assert rss_mib() - rss_idle < 150
