"""What every route shares: the server's config, the engine thread, the event loop's tokenizer, and the
checks a request passes at the edge before it reaches the engine (which re-checks through the same
functions of engine.request_limits)."""
from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from stallfree.engine import SamplingParams
from stallfree.engine.request_limits import InvalidParam, check_context_length, check_prompt_ids, short_repr
from stallfree.engine.server.loop import EngineLoop
from stallfree.engine.server.metrics import ServerMetrics
from stallfree.engine.server.protocol import (
    MAX_PROMPTS_PER_REQUEST,
    APIError,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    check_unicode,
)
from stallfree.engine.server.server_config import ServerConfig


def invalid_request(exc: InvalidParam) -> APIError:
    return APIError(400, str(exc), param=exc.param, code=exc.code)


@dataclass
class ServerState:
    cfg: ServerConfig
    engine_loop: EngineLoop
    tokenizer: object | None  # the event loop's own copy (the engine thread uses the engine's); None: ids only
    no_tokenizer_reason: str
    model_name: str
    max_model_len: int
    vocab_size: int
    metrics: ServerMetrics
    created: int

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(404, f"model {short_repr(model)} does not exist; this server serves {self.model_name!r}",
                           param="model", code="model_not_found")

    def require_tokenizer(self, param: str) -> None:
        if self.tokenizer is None:
            raise APIError(400, f"{param}: text needs a tokenizer: {self.no_tokenizer_reason}", param=param,
                           code="no_tokenizer")

    def encode(self, prompt: str | list[int], add_special_tokens: bool = True) -> list[int]:
        if isinstance(prompt, str):
            self.require_tokenizer("prompt")
            ids = self.tokenizer.encode(check_unicode(prompt, "prompt"), add_special_tokens=add_special_tokens)
        else:
            ids = list(prompt)
        try:
            check_prompt_ids(ids, self.vocab_size)
        except InvalidParam as exc:
            raise invalid_request(exc) from None
        return ids

    def prompt_text(self, prompt: str | list[int], ids: list[int]) -> str:
        """The text echo puts before a choice: the prompt as sent, a token-id prompt decoded."""
        if isinstance(prompt, str):
            return prompt
        return "" if self.tokenizer is None else self.tokenizer.decode(ids)

    def render_chat(self, messages: list[ChatMessage]) -> list[int]:
        self.require_tokenizer("messages")
        for i, m in enumerate(messages):
            check_unicode(m.text(), f"messages[{i}].content")
        if not getattr(self.tokenizer, "chat_template", None):
            raise APIError(400, f"model {self.model_name!r} has no chat template", param="messages")
        try:
            text = self.tokenizer.apply_chat_template([{"role": m.role, "content": m.text()} for m in messages],
                                                      add_generation_prompt=True, tokenize=False)
        except Exception as exc:  # template errors (e.g. a role order the template rejects)
            raise APIError(400, f"chat template failed: {exc}", param="messages") from None
        return self.encode(text, add_special_tokens=False)  # the template adds any BOS itself

    def sampling_params(self, body: CompletionRequest | ChatCompletionRequest, prompts: list[list[int]],
                        max_tokens: int | None) -> list[SamplingParams]:
        """One SamplingParams per prompt. The request schema checked each parameter's range (the table
        SamplingParams.validate checks, engine.request_limits); here, each prompt's context length."""
        if len(prompts) > min(MAX_PROMPTS_PER_REQUEST, self.cfg.max_waiting):
            raise APIError(400, f"at most {min(MAX_PROMPTS_PER_REQUEST, self.cfg.max_waiting)} prompts per request",
                           param="prompt")
        params, (logprobs, prompt_logprobs) = [], body.engine_logprobs()
        for p in prompts:
            try:
                check_context_length(len(p), max_tokens, self.max_model_len)
            except InvalidParam as exc:
                raise invalid_request(exc) from None
            params.append(SamplingParams(max_tokens=max_tokens or self.max_model_len - len(p),
                                         temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                                         seed=body.seed, ignore_eos=body.ignore_eos,
                                         stop_token_ids=body.stop_token_ids or [], logprobs=logprobs,
                                         prompt_logprobs=prompt_logprobs))
        return params


def server_state(request: Request) -> ServerState:
    """The app's ServerState (a route's dependency)."""
    return request.app.state.stallfree
