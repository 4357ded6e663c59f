"""The ``logprobs`` field of a choice, in vLLM's shapes: completions ``{tokens, token_logprobs,
top_logprobs, text_offset}`` and chat ``{content: [{token, logprob, bytes, top_logprobs}]}``."""
from __future__ import annotations

from stallfree.engine import TokenLogprob

# JSON has no -inf: a token the model gives no probability at all is reported at this (as vLLM does).
MIN_LOGPROB = -9999.0
# Prompt or generated: a token id and its logprob (None for the first prompt token, which has no prefix).
Entry = tuple[int, TokenLogprob | None]


class LogprobFormat:
    """Token strings come from decoding each token alone; without a tokenizer they are "token_id:<id>"
    (vLLM's return_tokens_as_token_ids form)."""

    def __init__(self, tokenizer, chat: bool):
        self.tokenizer, self.chat = tokenizer, chat

    def token(self, token_id: int) -> str:
        return f"token_id:{token_id}" if self.tokenizer is None else self.tokenizer.decode([token_id])

    def choice(self, entries: list[Entry], text_offset: int) -> dict:
        """The field for ``entries``; ``text_offset``: characters of the choice's text before the first."""
        return self._chat(entries) if self.chat else self._completion(entries, text_offset)

    def _completion(self, entries: list[Entry], text_offset: int) -> dict:
        tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
        for token_id, lp in entries:
            token = self.token(token_id)
            tokens.append(token)
            offsets.append(text_offset)
            text_offset += len(token)
            token_logprobs.append(None if lp is None else max(lp.logprob, MIN_LOGPROB))
            # The token itself, then the k most likely: up to k + 1 entries, as OpenAI and vLLM give them.
            top_logprobs.append(None if lp is None else {self.token(i): max(v, MIN_LOGPROB)
                                                         for i, v in [(token_id, lp.logprob), *lp.top]})
        return {"text_offset": offsets, "token_logprobs": token_logprobs, "tokens": tokens,
                "top_logprobs": top_logprobs}

    def _chat(self, entries: list[Entry]) -> dict:
        return {"content": [self._chat_token(token_id, lp.logprob) | {
            "top_logprobs": [self._chat_token(i, v) for i, v in lp.top]} for token_id, lp in entries]}

    def _chat_token(self, token_id: int, logprob: float) -> dict:
        token = self.token(token_id)
        return {"token": token, "logprob": max(logprob, MIN_LOGPROB),
                "bytes": list(token.encode("utf-8", errors="replace"))}
