"""The server's endpoints, one handler each. A request arrives through the middleware (engine/server/http.py),
its body is parsed and range-checked by its schema (engine/server/protocol.py), the handler checks its prompts
against the model (ServerState) and hands a Generation (engine/server/generate.py) to the engine thread."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from stallfree.engine.server.commands import EngineDead
from stallfree.engine.server.generate import Generation, api_error
from stallfree.engine.server.http import SSEResponse, until_disconnected
from stallfree.engine.server.logprobs_format import LogprobFormat
from stallfree.engine.server.openai_format import OpenAIFormat, collect, stream_events
from stallfree.engine.server.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    TokenizeRequest,
)
from stallfree.engine.server.state import ServerState, server_state

router = APIRouter()
State = Annotated[ServerState, Depends(server_state)]


async def generate(st: ServerState, request: Request, body: CompletionRequest | ChatCompletionRequest,
                   prompts: list[list[int]], max_tokens: int | None, echo: list[str] | None = None) -> Response:
    """Submit the checked prompts and answer as one JSON response or an SSE stream."""
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


@router.post("/v1/completions")
async def completions(st: State, request: Request, body: CompletionRequest) -> Response:
    st.check_model(body.model)
    texts = body.prompts()
    prompts = [st.encode(p) for p in texts]
    echo = [st.prompt_text(text, ids) for text, ids in zip(texts, prompts, strict=True)] if body.echo else None
    return await generate(st, request, body, prompts, body.max_tokens, echo)


@router.post("/v1/chat/completions")
async def chat_completions(st: State, request: Request, body: ChatCompletionRequest) -> Response:
    st.check_model(body.model)
    return await generate(st, request, body, [st.render_chat(body.messages)],
                          body.max_completion_tokens or body.max_tokens)


@router.post("/tokenize")
async def tokenize(st: State, body: TokenizeRequest) -> dict:
    st.check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "send exactly one of 'prompt' or 'messages'", param="prompt")
    ids = st.encode(body.prompt, body.add_special_tokens) if body.messages is None else st.render_chat(body.messages)
    return {"tokens": ids, "count": len(ids), "max_model_len": st.max_model_len}


@router.get("/v1/models")
async def models(st: State) -> dict:
    return {"object": "list", "data": [{"id": st.model_name, "object": "model", "created": st.created,
                                        "owned_by": "stallfree", "max_model_len": st.max_model_len}]}


@router.get("/health")
async def health(st: State) -> JSONResponse:
    if not st.engine_loop.alive:
        raise APIError(503, st.engine_loop.error or "the engine is not running", type="server_error",
                       code="engine_unavailable")
    return JSONResponse({"status": "ok"})


@router.get("/stallfree/batches")
async def batches(st: State, since: float = 0.0, limit: Annotated[int | None, Query(ge=1)] = None) -> Response:
    """The retained BatchRecords (one per iteration) that started at or after ``since`` (epoch s), at
    most ``limit`` of them; ``next_since`` is the ``since`` of the next page (null: none)."""
    return StreamingResponse(st.engine_loop.history.page_json(since, limit), media_type="application/json")


@router.post("/reset_prefix_cache")
async def reset_prefix_cache(st: State) -> JSONResponse:
    """Forget every cached prefix (vLLM's route): the next requests compute their whole prompts."""
    try:
        forgotten = await st.engine_loop.call(lambda engine: engine.reset_prefix_cache())
    except EngineDead as exc:
        raise api_error(exc) from None
    return JSONResponse({"status": "ok", "forgotten_blocks": forgotten})


@router.get("/metrics")
async def metrics(st: State) -> Response:
    return Response(st.metrics.render(), media_type=CONTENT_TYPE_LATEST)
