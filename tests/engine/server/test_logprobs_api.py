"""Completions logprobs / echo and chat logprobs / top_logprobs in vLLM's shapes, streamed and not, with
values equal to HF transformers' on the same weights; what stays unsupported is a 400 naming it."""
from __future__ import annotations

import json

from tests.helpers.hf_logprobs import hf_token_logprobs
from tests.helpers.server import PROMPT, sse_chunks

TOL = 1e-4
TOKENS = [11, 12, 13, 14, 15, 16, 17]
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}


def completion(http, **body) -> dict:
    r = http.post("/v1/completions", json={"prompt": TOKENS, "max_tokens": 3, "temperature": 0} | body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_echo_with_logprobs_scores_every_prompt_token_as_hf_does(http, tiny_path):
    choice = completion(http, echo=True, logprobs=2)
    lp = choice["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert len(lp["tokens"]) == len(TOKENS) + 3 and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    reference = hf_token_logprobs(tiny_path, TOKENS + choice["token_ids"])
    assert all(abs(a - b) < TOL for a, b in zip(lp["token_logprobs"][1:], reference, strict=True))
    # the token itself and the 2 most likely (up to 3 keys), the most likely at least as likely as it
    assert all(1 <= len(top) <= 3 and max(top.values()) >= value - TOL
               for top, value in zip(lp["top_logprobs"][1:], lp["token_logprobs"][1:], strict=True))
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]
    assert choice["text"] == completion(http, echo=True)["text"]


def test_logprobs_without_echo_cover_the_generated_tokens_and_echo_alone_prepends_the_prompt(http):
    lp = completion(http, logprobs=0)["logprobs"]
    assert len(lp["token_logprobs"]) == 3 and all(len(top) == 1 for top in lp["top_logprobs"])
    plain, echoed = completion(http), http.post("/v1/completions", json={
        "prompt": PROMPT, "max_tokens": 3, "temperature": 0, "echo": True}).json()["choices"][0]
    assert plain["logprobs"] is None and echoed["logprobs"] is None and echoed["text"].startswith(PROMPT)


def test_stream_chunks_carry_their_tokens_logprobs(http):
    whole = completion(http, echo=True, logprobs=1)
    r = http.post("/v1/completions", json={"prompt": TOKENS, "max_tokens": 3, "temperature": 0, "echo": True,
                                           "logprobs": 1, "stream": True})
    chunks, done = sse_chunks(r.iter_lines())
    parts = [c["choices"][0]["logprobs"] for c in chunks]
    assert done and len(parts[0]["tokens"]) == len(TOKENS) + 1 and all(len(p["tokens"]) == 1 for p in parts[1:])
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [x for p in parts for x in p[key]] == whole["logprobs"][key]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["text"]


def test_chat_logprobs_in_openai_shape(http):
    r = http.post("/v1/chat/completions", json=CHAT | {"logprobs": True, "top_logprobs": 2})
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 3
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"} and len(entry["top_logprobs"]) == 2
        assert entry["bytes"] == list(entry["token"].encode()) and entry["logprob"] <= 0
        assert entry["top_logprobs"][0]["logprob"] >= entry["top_logprobs"][1]["logprob"]
        assert entry["logprob"] == entry["top_logprobs"][0]["logprob"]  # greedy picks the most likely
    plain = http.post("/v1/chat/completions", json=CHAT | {"logprobs": True}).json()["choices"][0]["logprobs"]
    assert [e["top_logprobs"] for e in plain["content"]] == [[]] * 3
    r = http.post("/v1/chat/completions", json=CHAT | {"logprobs": True, "stream": True})
    chunks, _ = sse_chunks(r.iter_lines())
    assert [c["choices"][0]["logprobs"]["content"][0]["token"] for c in chunks] == [e["token"] for e in plain["content"]]


def test_several_prompts_each_echo_their_own(http):
    r = http.post("/v1/completions", json={"prompt": ["ab", "cd"], "max_tokens": 1, "echo": True, "logprobs": 0})
    choices = sorted(r.json()["choices"], key=lambda c: c["index"])
    assert [c["text"][:2] for c in choices] == ["ab", "cd"]
    assert all(c["logprobs"]["token_logprobs"][0] is None for c in choices)


def test_what_stays_unsupported_is_a_400_naming_it(http):
    for body, name in [({"best_of": 2}, "best_of"), ({"prompt_logprobs": 1}, "prompt_logprobs")]:
        r = http.post("/v1/completions", json={"prompt": "hi"} | body)
        assert (r.status_code, r.json()["error"]["param"]) == (400, name), r.text
    r = http.post("/v1/chat/completions", json=CHAT | {"top_logprobs": 2})
    assert (r.status_code, r.json()["error"]["param"]) == (400, "top_logprobs")
    assert json.loads(http.post("/v1/completions", json={"prompt": "hi", "best_of": 1}).text)["choices"]
