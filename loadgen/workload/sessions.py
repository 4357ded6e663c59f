"""Multi-turn sessions as token ids (``lengths.kind: chat_sessions`` / ``agentic_sessions``): each turn's prompt
is the session's history, every earlier prompt and answer, plus a new message, so a server with a prefix cache
serves the history from it. A follow-up turn is sent ``think_time_s`` after the previous turn's response ends
(loadgen.openai_client.openloop, loadgen.targets.inprocess); the sessions arrive by the arrival process.

The history holds the answers drawn here, not the ones the server streamed: every run of a seed sends the same
prompts, and the workload's ideal hit rate (loadgen.workload.prefix_reuse.ideal_hit_rate) is exact.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from stallfree.engine.config_checks import ConfigError, is_int, is_number, require
from stallfree.engine.records.request_spec import CONTEXT_LIMIT, LAST_TURN, REQUEST_LIMIT, RequestSpec
from stallfree.loadgen.workload.prefix_reuse import TokenIds


@dataclass(frozen=True)
class Turn:
    prompt: list[int]
    output_len: int
    think_time_s: float  # after the previous turn's response ended (0 for a session's first turn)
    messages: list[dict] | None = None  # chat messages of a text session (prompt: their template's token ids)


Session = list[Turn]


def _int_range(key: str, value: object, low: int) -> tuple[int, int]:
    """``[lo, hi]`` (or one integer) of integers >= low, lo <= hi."""
    pair = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else [value, value]
    require(len(pair) == 2 and all(is_int(v) and v >= low for v in pair) and pair[0] <= pair[1], f"lengths.{key}",
            f"an integer >= {low} or a range [lo, hi] of them", value)
    return pair[0], pair[1]


class _Draw:
    """Random lengths, token ids and think times of one workload's sessions."""

    def __init__(self, rng: np.random.Generator, ids: TokenIds, think_time_s: float):
        require(is_number(think_time_s) and think_time_s >= 0, "lengths.think_time_s", "a number >= 0", think_time_s)
        self.rng, self.ids, self.think_time_s = rng, ids, think_time_s

    def length(self, bounds: tuple[int, int]) -> int:
        return int(self.rng.integers(bounds[0], bounds[1] + 1))

    def tokens(self, n: int) -> list[int]:
        return self.rng.integers(self.ids.low, self.ids.high, size=n).tolist()

    def think(self) -> float:
        return float(self.rng.exponential(self.think_time_s)) if self.think_time_s > 0 else 0.0


def _grow(draw: _Draw, first: list[int], turns: tuple[int, int], message: tuple[int, int],
          output: tuple[int, int]) -> Session:
    """One session: ``first`` as the first prompt; each later prompt the previous one, its answer and a message."""
    prompt, session = first, []
    for k in range(draw.length(turns)):
        if k:
            prompt = prompt + draw.tokens(session[-1].output_len) + draw.tokens(draw.length(message))
        session.append(Turn(prompt, draw.length(output), draw.think() if k else 0.0))
    return session


def _endless(make) -> Iterator[Session]:
    """Sessions from ``make()`` for as long as they are taken (session_specs takes the requests it needs)."""
    while True:
        yield make()


def chat_sessions(rng: np.random.Generator, ids: TokenIds, turns: list | int = (2, 8), user_len: list | int = (32, 256),
                  output_len: list | int = (32, 128), think_time_s: float = 2.0) -> Iterator[Session]:
    """Chat: each turn a user message of ``user_len`` tokens after the history, answered in ``output_len``
    tokens; ``turns`` per session; think times exponential with mean ``think_time_s`` (0: none)."""
    turn_range, user, output = _int_range("turns", turns, 1), _int_range("user_len", user_len, 1), \
        _int_range("output_len", output_len, 1)
    draw = _Draw(rng, ids, think_time_s)
    return _endless(lambda: _grow(draw, draw.tokens(draw.length(user)), turn_range, user, output))


def agentic_sessions(rng: np.random.Generator, ids: TokenIds, system_len: int = 1024, tools_len: int = 512,
                     task_len: list | int = (64, 256), tool_output_len: list | int = (64, 512),
                     turns: list | int = (4, 16), output_len: list | int = (16, 96),
                     think_time_s: float = 0.5) -> Iterator[Session]:
    """An agent: one system prompt of ``system_len`` tokens and tool block of ``tools_len`` shared by every
    session, a task of ``task_len`` of its own; each later turn appends the previous answer (a tool call of
    ``output_len``) and the tool's output (``tool_output_len``); ``think_time_s``: the mean tool run time."""
    for key, value in (("system_len", system_len), ("tools_len", tools_len)):
        require(is_int(value) and value >= 0, f"lengths.{key}", "an integer >= 0", value)
    task, tool_output = _int_range("task_len", task_len, 1), _int_range("tool_output_len", tool_output_len, 1)
    turn_range, output = _int_range("turns", turns, 1), _int_range("output_len", output_len, 1)
    draw = _Draw(rng, ids, think_time_s)
    shared = draw.tokens(system_len + tools_len)
    return _endless(lambda: _grow(draw, shared + draw.tokens(draw.length(task)), turn_range, tool_output, output))


def fitted(session: Session, max_total_tokens: int | None) -> tuple[Session, str]:
    """The turns of a session that fit ``max_total_tokens`` (prompt + output) and why it ends: the first turn
    that does not fit ends it (CONTEXT_LIMIT; a first turn over it is cut to fit, keeping its start, or, as text,
    leaves the session out)."""
    if max_total_tokens is None:
        return session, LAST_TURN
    first_over = next((k for k, turn in enumerate(session) if len(turn.prompt) + turn.output_len > max_total_tokens),
                      len(session))
    if first_over == len(session):
        return session, LAST_TURN
    if first_over == 0 and session[0].messages is not None:  # text cannot be cut: the session is left out
        return [], CONTEXT_LIMIT
    if first_over == 0:
        turn = session[0]
        output = min(turn.output_len, max(1, max_total_tokens // 2))
        return [Turn(turn.prompt[:max_total_tokens - output], output, 0.0)], CONTEXT_LIMIT
    return session[:first_over], CONTEXT_LIMIT


SESSION_WORKLOADS = {"chat_sessions": chat_sessions, "agentic_sessions": agentic_sessions}


def session_specs(sessions: Iterable[Session], offsets: np.ndarray, num_requests: int,
                  max_total_tokens: int | None) -> list[RequestSpec]:
    """The first ``num_requests`` turns of the sessions, session by session, each session starting at the next
    of ``offsets``; the last one kept may be cut short by the request count (REQUEST_LIMIT)."""
    specs: list[RequestSpec] = []
    kept = 0
    for session in sessions:
        turns, end = fitted(session, max_total_tokens)
        if not turns:
            continue
        room = num_requests - len(specs)
        if len(turns) > room:
            turns, end = turns[:room], REQUEST_LIMIT
        for k, turn in enumerate(turns):
            specs.append(RequestSpec(request_id=f"req-{len(specs):06d}", send_offset_s=float(offsets[kept]),
                                     prompt_token_ids=turn.prompt, max_tokens=turn.output_len, messages=turn.messages,
                                     session_id=f"session-{kept:05d}", turn=k, think_time_s=turn.think_time_s,
                                     session_end=end if k == len(turns) - 1 else None))
        kept += 1
        if len(specs) == num_requests:
            return specs
    raise ConfigError(f"num_requests must be <= the {len(specs)} turns of the workload's sessions that fit "
                      f"max_total_tokens={max_total_tokens}, got {num_requests}")
