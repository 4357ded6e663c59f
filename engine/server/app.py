"""The FastAPI app: the engine thread, the routes (engine/server/routes.py), their error handlers, the
middleware and the HTTP metrics, put together."""
from __future__ import annotations

import copy
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from prometheus_fastapi_instrumentator import Instrumentator

from stallfree.engine import EngineConfig, LLMEngine
from stallfree.engine.server.error_handlers import ERROR_HANDLERS
from stallfree.engine.server.history import BatchHistory
from stallfree.engine.server.http import RequestContextMiddleware
from stallfree.engine.server.loop import EngineLoop
from stallfree.engine.server.metrics import ServerMetrics
from stallfree.engine.server.routes import router
from stallfree.engine.server.server_config import ServerConfig
from stallfree.engine.server.state import ServerState

__all__ = ["ServerConfig", "build_app"]


def build_app(engine: EngineConfig | dict | None = None, server_cfg: ServerConfig | None = None) -> FastAPI:
    """Load the engine (an EngineConfig, or ``EngineConfig.from_kwargs`` arguments) and build the app; the
    engine thread runs while the app is being served (lifespan). Raises ValueError on bad configuration."""
    cfg = server_cfg or ServerConfig()
    cfg.validate()
    config = engine if isinstance(engine, EngineConfig) else EngineConfig.from_kwargs(**(engine or {}))
    history = BatchHistory(cfg.batch_history_max_records, cfg.batch_history_max_age_s)
    engine_loop = EngineLoop(lambda: LLMEngine.from_config(config), cfg.max_waiting, history)
    llm_engine = engine_loop.engine
    model_name = cfg.served_model_name or llm_engine.model_name
    metrics = ServerMetrics(model_name, llm_engine.max_model_len)
    state = ServerState(cfg, engine_loop, copy.deepcopy(llm_engine.tokenizer), llm_engine.no_tokenizer_reason,
                        model_name, llm_engine.max_model_len, llm_engine.vocab_size, metrics, int(time.time()))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        engine_loop.start(metrics)
        yield
        engine_loop.stop()

    app = FastAPI(title="stallfree", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None,
                  strict_content_type=False)  # a body without Content-Type is parsed as JSON
    app.state.stallfree = state
    for exc_type, handler in ERROR_HANDLERS.items():
        app.add_exception_handler(exc_type, handler)
    app.include_router(router)
    app.add_middleware(RequestContextMiddleware, api_key=cfg.api_key,
                       metrics_require_api_key=cfg.metrics_require_api_key, max_body_bytes=cfg.max_body_bytes,
                       body_read_timeout_s=cfg.body_read_timeout_s)
    # HTTP series per handler (route template; "none" for unknown paths), method and status (2xx, 4xx, ...)
    # as vLLM's server has them, around the middleware above so that 401, 408, 413 and 500 count too.
    Instrumentator(excluded_handlers=["^/metrics$", "^/health$"], registry=metrics.registry).instrument(app)
    return app
