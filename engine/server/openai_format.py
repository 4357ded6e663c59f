"""OpenAI response bodies and stream chunks (plus the "stallfree" timing extension) from token events."""
from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

from stallfree.engine.server.commands import EngineDead, EngineFailed
from stallfree.engine.server.generate import Generation, TokenEvent, api_error
from stallfree.engine.server.logprobs_format import Entry, LogprobFormat


class OpenAIFormat:
    """Builds completion / chat.completion responses and stream chunks."""

    def __init__(self, chat: bool, response_id: str, model: str, logprobs: LogprobFormat | None = None,
                 echo: list[str] | None = None):
        """``logprobs``: the request asked for them; ``echo``: each choice's prompt text, put before its text."""
        self.chat, self.logprobs, self.echo = chat, logprobs, echo
        self.text_offsets: dict[int, int] = {}  # streaming: each choice's logprob token characters so far
        self.id = response_id
        self.model = model
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"
        self.chunk_object = "chat.completion.chunk" if chat else "text_completion"

    def _envelope(self, obj: str, choices: list[dict]) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def chunk(self, ev: TokenEvent, first: bool) -> dict:
        choice: dict = {"index": ev.index}
        text = self.echo[ev.index] + ev.text if self.echo and first else ev.text
        if self.chat:
            choice["delta"] = {"role": "assistant", "content": text} if first else {"content": text}
        else:
            choice["text"] = text
        logprobs = None
        if self.logprobs is not None:
            entries = self._entries(ev)
            logprobs = self.logprobs.choice(entries, self.text_offsets.get(ev.index, 0))
            self.text_offsets[ev.index] = self.text_offsets.get(ev.index, 0) + sum(
                len(self.logprobs.token(token_id)) for token_id, _ in entries)
        choice |= {"logprobs": logprobs, "finish_reason": ev.finish_reason, "token_ids": [ev.token_id]}
        chunk = self._envelope(self.chunk_object, [choice])
        if ev.timings is not None:
            chunk["stallfree"] = ev.timings
        return chunk

    @staticmethod
    def _entries(ev: TokenEvent) -> list[Entry]:
        """The logprob entries of an event: the prompt's (echo, on a choice's first token), then its token's."""
        return [*(ev.prompt or []), (ev.token_id, ev.logprob)]

    def usage_chunk(self, usage: dict, timings: dict | None) -> dict:
        """The final chunk (include_usage); single-prompt requests repeat their timings here."""
        chunk = self._envelope(self.chunk_object, []) | {"usage": usage}
        return chunk if timings is None else chunk | {"stallfree": timings}

    def response(self, events: list[TokenEvent], num_choices: int, usage: dict) -> dict:
        texts = list(self.echo) if self.echo else [""] * num_choices
        token_ids: list[list[int]] = [[] for _ in range(num_choices)]
        entries: list[list[Entry]] = [[] for _ in range(num_choices)]
        last: list[TokenEvent] = [events[0]] * num_choices  # every choice ends with a finish_reason event
        for ev in events:
            texts[ev.index] += ev.text
            token_ids[ev.index].append(ev.token_id)
            entries[ev.index] += self._entries(ev)
            if ev.finish_reason is not None:
                last[ev.index] = ev
        choices = [{"index": i,
                    **({"message": {"role": "assistant", "content": texts[i]}} if self.chat else {"text": texts[i]}),
                    "logprobs": None if self.logprobs is None else self.logprobs.choice(entries[i], 0),
                    "finish_reason": last[i].finish_reason, "token_ids": token_ids[i],
                    "stallfree": last[i].timings} for i in range(num_choices)]
        body = self._envelope(self.object, choices) | {"usage": usage}
        return body if num_choices > 1 else body | {"stallfree": choices[0]["stallfree"]}


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, separators=(',', ':'))}\n\n"


async def stream_events(gen: Generation, fmt: OpenAIFormat, include_usage: bool,
                        continuous_usage: bool = False) -> AsyncIterator[str]:
    """The SSE body: a chunk per token, the usage chunk if asked, an error event if the engine failed,
    then ``data: [DONE]``. ``continuous_usage`` (vLLM's ``continuous_usage_stats``): every token chunk
    also carries its choice's usage so far, so a client counts generated tokens exactly, special
    tokens (which stream as empty text) included."""
    started: set[int] = set()
    counts = [0] * len(gen.choices)
    try:
        async for ev in gen.events():
            chunk = fmt.chunk(ev, first=ev.index not in started)
            counts[ev.index] += 1
            if continuous_usage:
                prompt = gen.choices[ev.index].num_prompt_tokens
                chunk["usage"] = {"prompt_tokens": prompt, "completion_tokens": counts[ev.index],
                                  "total_tokens": prompt + counts[ev.index]}
            yield sse(chunk)
            started.add(ev.index)
        if include_usage:
            yield sse(fmt.usage_chunk(gen.usage, gen.timings if len(gen.choices) == 1 else None))
    except (EngineFailed, EngineDead) as exc:
        yield sse(api_error(exc).body())
    yield sse("[DONE]")


async def collect(gen: Generation, fmt: OpenAIFormat, num_choices: int) -> dict:
    """The non-streaming response body; raises APIError (500 / 503) if the engine failed."""
    try:
        events = [ev async for ev in gen.events()]
    except (EngineFailed, EngineDead) as exc:
        raise api_error(exc) from None
    return fmt.response(events, num_choices, gen.usage)
