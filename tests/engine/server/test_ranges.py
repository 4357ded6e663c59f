"""Every request parameter against its range (engine/request_limits.py), on completions and chat: a value
outside it is a 400 naming the field, a value the server does not implement is refused unless it is
the default, the edges are served, and docs/server.md lists every parameter with its range."""
from __future__ import annotations

import asyncio

import pytest

from stallfree.engine.request_limits import RANGES
from stallfree.engine.server.protocol import NOT_SUPPORTED, ChatCompletionRequest, CompletionRequest
from tests.helpers.paths import ROOT
from tests.helpers.server import async_client, greedy, stream_tokens

HUGE = "9" * 4300  # the top_k, as JSON text (the longest integer Python's JSON decoder reads)
COMPLETION = '{"prompt": "hi", "max_tokens": 2, '
CHAT = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, '
OUT_OF_RANGE = [  # (field, JSON value) on both endpoints: a 400 naming the field
    ("top_k", HUGE), ("top_k", "-2"), ("top_k", "9223372036854775808"), ("top_k", "1.5"),
    ("temperature", "NaN"), ("temperature", "Infinity"), ("temperature", "-1e-9"), ("temperature", "2.01"),
    ("temperature", HUGE), ("temperature", "1e400"),
    ("top_p", "0"), ("top_p", "-Infinity"), ("top_p", "1.0001"), ("top_p", "NaN"),
    ("seed", "18446744073709551616"), ("seed", "-9223372036854775809"), ("seed", HUGE),
    ("max_tokens", "0"), ("max_tokens", "-1"), ("max_tokens", "9223372036854775808"), ("max_tokens", HUGE),
    ("n", "2"), ("n", "0"), ("n", HUGE),
    ("min_p", "1.5"), ("min_p", "NaN"), ("presence_penalty", "2.5"), ("frequency_penalty", "-3"),
    ("repetition_penalty", "0"), ("repetition_penalty", HUGE),
    ("logit_bias", '{"5": 101}'), ("logit_bias", '{"5": NaN}'), ("logit_bias", '{"x": 1}'),
    ("logit_bias", '{' + ", ".join(f'"{i}": 1' for i in range(301)) + '}'),
    ("stop", '["x", ' + '"y", ' * 16 + '"z"]'), ("stop", '"' + "s" * 257 + '"'), ("stop", '[""]'), ("stop", "[1]"),
    ("stop_token_ids", "[-1]"), ("stop_token_ids", "[" + HUGE + "]"), ("stop_token_ids", "[" + "1, " * 64 + "1]"),
    ("ignore_eos", "1"), ("stream", '"true"'), ("stream_options", '{"include_usage": 1}'),
]
PER_ENDPOINT = [
    (COMPLETION, "logprobs", "21"), (COMPLETION, "logprobs", "-1"), (COMPLETION, "logprobs", HUGE),
    (COMPLETION, "echo", "1"), (CHAT, "logprobs", "1"), (CHAT, "top_logprobs", "21"), (CHAT, "top_logprobs", HUGE),
    (CHAT, "max_completion_tokens", "0"), (CHAT, "max_completion_tokens", HUGE),
]
UNSUPPORTED = [("min_p", "0.1"), ("presence_penalty", "0.5"), ("frequency_penalty", "-0.5"),
               ("repetition_penalty", "1.1"), ("logit_bias", '{"5": 10}')]


def post_raw(http, base: str, name: str, value: str):
    path = "/v1/chat/completions" if base is CHAT else "/v1/completions"
    return http.post(path, content=f'{base}"{name}": {value}}}', headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("base", [COMPLETION, CHAT], ids=["completions", "chat"])
@pytest.mark.parametrize(("name", "value"), OUT_OF_RANGE, ids=[f"{n}={v[:12]}" for n, v in OUT_OF_RANGE])
def test_every_parameter_out_of_range_is_a_400_naming_it(http, base, name, value):
    r = post_raw(http, base, name, value)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == name and error["message"].startswith(f"{name}: "), error
    assert error["code"] in ("invalid_value", "invalid_type") and len(error["message"]) < 300


@pytest.mark.parametrize(("base", "name", "value"), PER_ENDPOINT, ids=[f"{n}={v[:12]}" for _, n, v in PER_ENDPOINT])
def test_endpoint_parameters_out_of_range_are_400s_naming_them(http, base, name, value):
    r = post_raw(http, base, name, value)
    assert r.status_code == 400 and r.json()["error"]["param"] == name, r.text[:300]


@pytest.mark.parametrize(("name", "value"), [(n, v) for n, v in UNSUPPORTED + [("logprobs", "2"), ("echo", "true")]
                                             if n in NOT_SUPPORTED])
def test_a_parameter_the_server_does_not_implement_is_refused_unless_default(http, name, value):
    r = post_raw(http, COMPLETION, name, value)
    error = r.json()["error"]
    assert (r.status_code, error["param"], error["code"]) == (400, name, "unsupported_parameter"), error
    default = {"min_p": "0", "presence_penalty": "0", "frequency_penalty": "0", "repetition_penalty": "1",
               "logit_bias": "{}", "logprobs": "null", "echo": "false"}[name]
    assert post_raw(http, COMPLETION, name, default).status_code == 200


def test_the_edges_of_every_range_are_served(http):
    body = {"prompt": "hi", "max_tokens": 2, "temperature": 2, "top_p": 1e-300, "top_k": 2**63 - 1,
            "seed": 2**64 - 1, "stop_token_ids": list(range(64)), "n": 1, "min_p": 0, "logit_bias": {}}
    assert http.post("/v1/completions", json=body).status_code == 200
    body |= {"temperature": 1e-300, "seed": -(2**63), "top_k": -1, "top_p": 1}
    assert http.post("/v1/completions", json=body).status_code == 200


def test_the_reported_top_k_fails_alone_while_a_stream_runs(server, http, llm):
    """The issue: a 4,300-digit top_k got a 500 and cut every in-flight stream short."""
    prompt, max_tokens = [11, 12, 13, 14], 60
    _, reference = greedy(llm, prompt, max_tokens)

    async def run():
        async with async_client(server.url) as client:
            stream = asyncio.ensure_future(stream_tokens(client, {
                "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}))
            await asyncio.sleep(0.2)
            bad = await client.post("/v1/completions", content=f'{{"prompt": "hi", "max_tokens": 5, "top_k": {HUGE}}}',
                                    headers={"Content-Type": "application/json"})
            return bad, await stream

    bad, tokens = asyncio.run(run())
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "top_k"
    assert tokens == reference


def test_prompt_token_ids_beyond_the_vocabulary_are_a_400(http):
    for prompt in ([5, 2048], [5, int(HUGE)], [[5], [2**64]]):
        r = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt" and len(r.text) < 400



def test_docs_list_every_parameter_and_its_range():
    docs = ROOT / "docs" / "server.md"
    table = docs.read_text().split("## Parameters and their ranges")[1].split("\n## ")[0]
    rows = {}  # field -> its rows' text
    for line in table.splitlines():
        if line.startswith("| `"):
            for name in line.split("|")[1].split(","):
                rows[name.strip(" `")] = rows.get(name.strip(" `"), "") + line
    fields = set(CompletionRequest.model_fields) | set(ChatCompletionRequest.model_fields)
    assert fields | set(RANGES) <= set(rows), (fields | set(RANGES)) - set(rows)
    for name, limit in RANGES.items():  # each range as the table writes it
        assert limit.describe().split(" in ")[-1] in rows[name].replace("a number in ", "").replace(
            "an integer in ", ""), (name, limit.describe(), rows[name])
    assert all("**only" in rows[name] for name in NOT_SUPPORTED)
