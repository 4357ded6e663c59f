"""Hypothesis strategies for hostile requests: for every field the server takes, values that its schema
must refuse (integers beyond int64, NaN and infinities, out-of-range and negative numbers, wrong types,
huge lists and strings, values it does not implement). Shared by the fuzz test and the chaos test.

``BAD_COMPLETION`` / ``BAD_CHAT``: field -> strategy of bad values. Drawn on top of a valid body, any
one of them must get a 4xx naming that field (413 for a body over the size limit, 404 for a model
that is not served).
"""
from __future__ import annotations

import math

from hypothesis import strategies as st

from stallfree.engine.request_limits import RANGES, SIZES, Range
from stallfree.engine.server.protocol import NOT_SUPPORTED

HUGE = int("9" * 4300)  # the top_k: the longest integer Python's JSON decoder reads
VOCAB = 2048  # the tiny preset's
CONTEXT = 2048  # ... and its max_model_len

wrong_types = st.sampled_from(["1", "", True, [1], {"a": 1}, [[]]])
non_finite = st.sampled_from([math.nan, math.inf, -math.inf])
floats = {"allow_subnormal": False}  # some library in the process sets flush-to-zero


def outside(r: Range, optional: bool = False) -> st.SearchStrategy:
    """Values outside ``r`` (and of the wrong type); ``optional``: null is allowed, so not drawn."""
    if r.integer:
        values = (st.integers(max_value=int(r.low) - 1) | st.integers(min_value=int(r.high) + 1)
                  | st.sampled_from([HUGE, -HUGE, 2**64, 2**63]).filter(lambda v: v not in r)
                  | st.floats(**floats))  # no float is an integer here (strict: 2.0 is not 2)
    else:
        below = st.floats(max_value=r.low, **floats) if r.low_open else \
            st.floats(max_value=r.low - 1e-6, **floats)
        values = below | st.floats(min_value=r.high + 1e-6, **floats) | st.sampled_from([HUGE, -HUGE])
    return values | non_finite | wrong_types | (st.nothing() if optional else st.none())


def unsupported(name: str, in_range: st.SearchStrategy) -> st.SearchStrategy:
    """Bad values of an optional field: out of its range, and while the server does not implement it
    (NOT_SUPPORTED in engine/server/protocol.py) any ``in_range`` value but its default too."""
    out = outside(RANGES[name], optional=True)
    return out | in_range if name in NOT_SUPPORTED else out


def bad_flag(name: str) -> st.SearchStrategy:
    """Bad values of a boolean field: not booleans, and ``true`` while the server does not implement it."""
    return st.sampled_from([0, 1, "true", [True], None]) | (st.just(True) if name in NOT_SUPPORTED else st.nothing())


def too_many(limit: int, item: object) -> st.SearchStrategy:
    return st.integers(limit + 1, limit + 40).map(lambda n: [item] * n)


def long_text(min_chars: int, max_chars: int) -> st.SearchStrategy:
    return st.integers(min_chars, max_chars).map(lambda n: ("ab " * n)[:n])


token_ids = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=4)
bad_token_ids = (st.lists(st.integers(max_value=-1) | st.integers(min_value=VOCAB) | st.just(HUGE),
                          min_size=1, max_size=3).flatmap(lambda bad: token_ids.map(lambda ok: ok + bad))
                 | st.integers(CONTEXT, CONTEXT + 100).map(lambda n: [7] * n))  # over the context window
stop_size, stop_chars = SIZES["stop"].max_items, SIZES["stop_string"].max_items
BAD_COMMON = {
    **{name: outside(RANGES[name]) for name in ("temperature", "top_p", "top_k", "n")},
    "seed": outside(RANGES["seed"], optional=True),
    "max_tokens": outside(RANGES["max_tokens"], optional=True) | st.integers(CONTEXT, 10**12),
    "min_p": unsupported("min_p", st.floats(0.01, 1, **floats)),
    "presence_penalty": unsupported("presence_penalty", st.floats(-2, 2, **floats).filter(bool)),
    "frequency_penalty": unsupported("frequency_penalty", st.floats(-2, 2, **floats).filter(bool)),
    "repetition_penalty": unsupported("repetition_penalty", st.floats(0.01, 2, **floats).filter(lambda v: v != 1)),
    "logit_bias": (st.dictionaries(st.integers(0, VOCAB - 1).map(str), st.floats(-100, 100, **floats), min_size=1,
                                   max_size=3)
                   | st.dictionaries(st.integers(0, 9).map(str), outside(RANGES["logit_bias"], optional=True),
                                     min_size=1, max_size=2)
                   | st.sampled_from([{"a": 1}, {"-1": 1}, {"1" * 30: 1}])
                   | st.integers(SIZES["logit_bias"].max_items + 1, 400).map(lambda n: {str(i): 1 for i in range(n)})
                   | wrong_types),
    "stop": (too_many(stop_size, "x") | long_text(stop_chars + 1, 20_000) | st.just("")
             | st.lists(st.integers() | st.none(), min_size=1, max_size=2)),
    "stop_token_ids": (too_many(SIZES["stop_token_ids"].max_items, 1) | st.sampled_from([[-1], [2**64], [1.5], "3"])
                       | st.just([HUGE])),
    "ignore_eos": wrong_types.filter(lambda v: v is not True) | st.just(0),
    "stream": wrong_types.filter(lambda v: v is not True) | st.just(1),
    "stream_options": st.sampled_from(["1", True, [1], 5, {"include_usage": "yes"}, {"include_usage": None}]),
    "model": st.text(min_size=1, max_size=20).filter(lambda m: m != "tiny") | long_text(10_000, 200_000),
}
BAD_COMPLETION = {
    **BAD_COMMON,
    "prompt": (st.sampled_from(["", [], [[]], [""], {"text": "hi"}, 5, None]) | bad_token_ids
               | too_many(SIZES["prompt"].max_items, [5, 6]) | long_text(1_100_000, 1_200_000)),  # the last: 413
    "logprobs": unsupported("logprobs", st.integers(0, 20)),
    "echo": bad_flag("echo"),
}
BAD_CHAT = {
    **BAD_COMMON,
    "messages": (st.sampled_from([[], None, "hi", [{"role": "wizard", "content": "hi"}], [{"role": "user"}],
                                  [{"role": "user", "content": 5}], [{"role": "user", "content": "\ud800"}]])
                 | long_text(1_100_000, 1_200_000).map(lambda t: [{"role": "user", "content": t}])),
    "max_completion_tokens": outside(RANGES["max_tokens"], optional=True) | st.integers(CONTEXT, 10**12),
    "logprobs": bad_flag("logprobs"),
    "top_logprobs": unsupported("top_logprobs", st.integers(0, 20)),
}
VALID_COMPLETION = {"prompt": "hello there", "max_tokens": 2}
VALID_CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def bad_fields(bad: dict[str, st.SearchStrategy]) -> st.SearchStrategy:
    """One to three bad fields: {field: value}."""
    return st.lists(st.sampled_from(sorted(bad)), min_size=1, max_size=3, unique=True).flatmap(
        lambda names: st.fixed_dictionaries({name: bad[name] for name in names}))


hostile_requests = (st.tuples(st.just("/v1/completions"), bad_fields(BAD_COMPLETION).map(VALID_COMPLETION.__or__))
                    | st.tuples(st.just("/v1/chat/completions"), bad_fields(BAD_CHAT).map(VALID_CHAT.__or__)))
