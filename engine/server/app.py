"""The FastAPI app: OpenAI-compatible completions / chat, models, tokenize, health and metrics."""
from __future__ import annotations

import copy
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_fastapi_instrumentator import Instrumentator
from starlette.exceptions import HTTPException

from stallfree.engine import EngineConfig, LLMEngine, SamplingParams
from stallfree.engine.hydra_groups import is_int, is_number, require
from stallfree.engine.request_limits import InvalidParam, short_repr
from stallfree.engine.server.generate import Generation
from stallfree.engine.server.history import BatchHistory
from stallfree.engine.server.http import (
    ClientDisconnected,
    RequestContextMiddleware,
    SSEResponse,
    until_disconnected,
)
from stallfree.engine.server.logprobs_format import LogprobFormat
from stallfree.engine.server.loop import EngineLoop
from stallfree.engine.server.metrics import ServerMetrics
from stallfree.engine.server.openai_format import OpenAIFormat, collect, stream_events
from stallfree.engine.server.protocol import (
    MAX_PROMPTS_PER_REQUEST,
    APIError,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    TokenizeRequest,
    check_unicode,
    validation_error,
)

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port
    api_key: str | None = None  # required as "Authorization: Bearer <key>" on /v1/*, /tokenize, /stallfree/*
    metrics_require_api_key: bool = False  # ... and on /metrics (/health never needs it)
    max_waiting: int = 1024  # engine requests waiting to be scheduled; beyond: 429
    max_body_bytes: int = 1 << 20
    served_model_name: str | None = None  # default: the engine's model name
    timeout_graceful_shutdown: float = 5.0  # then in-flight streams are cancelled (and aborted)
    log_level: str = "warning"
    body_read_timeout_s: float = 30.0  # a body not complete this long after its request arrived: 408
    header_read_timeout_s: float = 10.0  # request line + headers must arrive within this of the first byte
    timeout_keep_alive_s: float = 5.0  # an idle keep-alive connection is closed after this
    batch_history_max_records: int = 5_000  # BatchRecords kept for GET /stallfree/batches (~700 B RSS each)
    batch_history_max_age_s: float = 300.0  # ... and none that started longer than this before the newest

    def validate(self) -> None:
        require(isinstance(self.host, str) and bool(self.host), "host", "a non-empty string", self.host)
        require(is_int(self.port) and 0 <= self.port <= 65535, "port", "in [0, 65535]", self.port)
        require(self.api_key is None or (isinstance(self.api_key, str) and bool(self.api_key)), "api_key",
                "a non-empty string or null", self.api_key)
        require(isinstance(self.metrics_require_api_key, bool), "metrics_require_api_key", "true or false",
                self.metrics_require_api_key)
        for key in ("max_waiting", "max_body_bytes", "batch_history_max_records"):
            require(is_int(getattr(self, key)) and getattr(self, key) >= 1, key, "an integer >= 1", getattr(self, key))
        require(is_number(self.timeout_graceful_shutdown) and self.timeout_graceful_shutdown >= 0,
                "timeout_graceful_shutdown", ">= 0", self.timeout_graceful_shutdown)
        for key in ("body_read_timeout_s", "header_read_timeout_s", "timeout_keep_alive_s", "batch_history_max_age_s"):
            require(is_number(getattr(self, key)) and getattr(self, key) > 0, key, "a number > 0", getattr(self, key))
        require(self.log_level in LOG_LEVELS, "log_level", f"one of {'|'.join(LOG_LEVELS)}", self.log_level)


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
        if not ids:
            raise APIError(400, "prompt is empty", param="prompt", code="empty_prompt")
        if max(ids) >= self.vocab_size:
            raise APIError(400, f"prompt: token ids must be in [0, {self.vocab_size}) (this model's vocabulary), "
                           f"got {short_repr(max(ids))}", param="prompt", code="invalid_value")
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
        if len(prompts) > min(MAX_PROMPTS_PER_REQUEST, self.cfg.max_waiting):
            raise APIError(400, f"at most {min(MAX_PROMPTS_PER_REQUEST, self.cfg.max_waiting)} prompts per request",
                           param="prompt")
        params, (logprobs, prompt_logprobs) = [], body.engine_logprobs()
        for p in prompts:
            budget = self.max_model_len - len(p)
            if budget < 1 or (max_tokens is not None and max_tokens > budget):
                asked = f"{len(p)} in the prompt" + (f" + {max_tokens} to generate" if max_tokens else "")
                raise APIError(400, f"this model's maximum context length is {self.max_model_len} tokens; the "
                               f"request needs {asked} (at least one must be generated)", param="max_tokens",
                               code="context_length_exceeded")
            sp = SamplingParams(max_tokens=max_tokens or budget, temperature=body.temperature, top_p=body.top_p,
                                top_k=body.top_k, seed=body.seed, ignore_eos=body.ignore_eos,
                                stop_token_ids=body.stop_token_ids or [], logprobs=logprobs,
                                prompt_logprobs=prompt_logprobs)
            try:
                sp.validate()  # the schema checked the same ranges (engine.request_limits): this never raises
            except InvalidParam as exc:
                raise APIError(400, str(exc), param=exc.param, code="invalid_value") from None
            params.append(sp)
        return params


def build_app(engine: EngineConfig | dict | None = None, server_cfg: ServerConfig | None = None) -> FastAPI:
    """Load the engine (an EngineConfig, or ``EngineConfig.from_kwargs`` arguments) and build the app; the
    engine thread runs while the app is being served (lifespan). Raises ValueError on bad configuration."""
    cfg = server_cfg or ServerConfig()
    cfg.validate()
    config = engine if isinstance(engine, EngineConfig) else EngineConfig.from_kwargs(**(engine or {}))
    history = BatchHistory(cfg.batch_history_max_records, cfg.batch_history_max_age_s)
    engine_loop = EngineLoop(lambda: LLMEngine.from_config(config), cfg.max_waiting, history)
    engine = engine_loop.engine
    model_name = cfg.served_model_name or engine.model_name
    metrics = ServerMetrics(model_name, engine.max_model_len)
    st = ServerState(cfg, engine_loop, copy.deepcopy(engine.tokenizer), engine.no_tokenizer_reason, model_name,
                     engine.max_model_len, engine.vocab_size, metrics, int(time.time()))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        st.engine_loop.start(metrics)
        yield
        st.engine_loop.stop()

    app = FastAPI(title="stallfree", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None,
                  strict_content_type=False)  # a body without Content-Type is parsed as JSON
    app.state.stallfree = st

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(HTTPException)
    async def _http_error(_: Request, exc: HTTPException) -> JSONResponse:
        # FastAPI's own 400: a body it could not decode (bad UTF-8, nesting too deep, huge numbers)
        code = {400: "invalid_json", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return APIError(exc.status_code, str(exc.detail), code=code, headers=exc.headers).response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error(exc).response()

    @app.exception_handler(ClientDisconnected)
    async def _gone(_: Request, __: ClientDisconnected) -> Response:
        return Response(status_code=499)

    async def generate(request: Request, body: CompletionRequest | ChatCompletionRequest,
                       prompts: list[list[int]], max_tokens: int | None, echo: list[str] | None = None) -> Response:
        body.check_supported()
        if body.stop:  # matched on the decoded text, which needs the tokenizer
            st.require_tokenizer("stop")
        params = st.sampling_params(body, prompts, max_tokens)
        rid = request.state.request_id
        gen = await Generation.start(st.engine_loop, st.tokenizer, prompts, params, body.stop or [], rid,
                                     request.state.arrival_time)
        chat = isinstance(body, ChatCompletionRequest)
        fmt = OpenAIFormat(chat, f"{'chatcmpl' if chat else 'cmpl'}-{rid}", st.model_name,
                           LogprobFormat(st.tokenizer, chat) if params[0].logprobs is not None else None, echo)
        if body.stream:
            return SSEResponse(stream_events(gen, fmt, body.include_usage, body.continuous_usage), on_close=gen.close,
                               headers={"Cache-Control": "no-cache"})
        try:
            return JSONResponse(await until_disconnected(request, collect(gen, fmt, len(prompts))))
        finally:
            gen.close()  # a no-op unless the client left (or the handler was cancelled) early

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest) -> Response:
        st.check_model(body.model)
        texts = body.prompts()
        prompts = [st.encode(p) for p in texts]
        echo = [st.prompt_text(text, ids) for text, ids in zip(texts, prompts, strict=True)] if body.echo else None
        return await generate(request, body, prompts, body.max_tokens, echo)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
        st.check_model(body.model)
        return await generate(request, body, [st.render_chat(body.messages)],
                              body.max_completion_tokens or body.max_tokens)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict:
        st.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "send exactly one of 'prompt' or 'messages'", param="prompt")
        ids = st.encode(body.prompt, body.add_special_tokens) if body.messages is None \
            else st.render_chat(body.messages)
        return {"tokens": ids, "count": len(ids), "max_model_len": st.max_model_len}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": st.model_name, "object": "model", "created": st.created,
                                            "owned_by": "stallfree", "max_model_len": st.max_model_len}]}

    @app.get("/health")
    async def health() -> JSONResponse:
        if not st.engine_loop.alive:
            raise APIError(503, st.engine_loop.error or "the engine is not running", type="server_error",
                           code="engine_unavailable")
        return JSONResponse({"status": "ok"})

    @app.get("/stallfree/batches")
    async def batches(since: float = 0.0, limit: Annotated[int | None, Query(ge=1)] = None) -> Response:
        """The retained BatchRecords (one per iteration) that started at or after ``since`` (epoch s), at
        most ``limit`` of them; ``next_since`` is the ``since`` of the next page (null: none)."""
        return StreamingResponse(history.page_json(since, limit), media_type="application/json")

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(st.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(RequestContextMiddleware, api_key=cfg.api_key,
                       metrics_require_api_key=cfg.metrics_require_api_key, max_body_bytes=cfg.max_body_bytes,
                       body_read_timeout_s=cfg.body_read_timeout_s)
    # HTTP series per handler (route template; "none" for unknown paths), method and status (2xx, 4xx, ...)
    # as vLLM's server has them, around the middleware above so that 401, 408, 413 and 500 count too.
    Instrumentator(excluded_handlers=["^/metrics$", "^/health$"], registry=metrics.registry).instrument(app)
    return app
