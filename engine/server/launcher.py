"""Serve the app with uvicorn: the server the CLI runs, and ``start_server`` (a server in a background
thread of this process, as a context manager) for tests and the bench harness:

    with start_server({"model": "tiny", "dtype": "float32"}) as server:   # a free port by default
        httpx.get(server.url + "/health")
"""
from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI

from stallfree.engine.server.app import ServerConfig, build_app
from stallfree.engine.server.h11_protocol import JSONErrorH11Protocol
from stallfree.engine.server.loop import EngineLoop
from stallfree.engine.server.state import ServerState

SHUTDOWN_MARGIN_S = 0.5


class _Server(uvicorn.Server):
    """uvicorn.Server that sets ``ready`` (and calls ``on_ready``) once it listens, and on shutdown
    stops the engine shortly before uvicorn's grace period ends: requests still in flight then end
    with an error (event) instead of being cancelled mid-response."""

    def __init__(self, config: uvicorn.Config, engine_loop: EngineLoop,
                 on_ready: Callable[[_Server], None] | None = None):
        super().__init__(config)
        self.engine_loop = engine_loop
        self.ready = threading.Event()
        self.on_ready = on_ready

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:
            self.ready.set()
            if self.on_ready is not None:
                self.on_ready(self)

    async def shutdown(self, sockets=None) -> None:
        grace = max(0.0, (self.config.timeout_graceful_shutdown or 0) - SHUTDOWN_MARGIN_S)
        asyncio.get_running_loop().call_later(grace, self.engine_loop.stop)
        await super().shutdown(sockets)

    @property
    def port(self) -> int:
        return self.servers[0].sockets[0].getsockname()[1]


def uvicorn_server(app: FastAPI, cfg: ServerConfig, on_ready: Callable[[_Server], None] | None = None) -> _Server:
    protocol = functools.partial(JSONErrorH11Protocol, header_timeout_s=cfg.header_read_timeout_s)
    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level, access_log=False,
                            timeout_graceful_shutdown=cfg.timeout_graceful_shutdown, http=protocol,
                            timeout_keep_alive=cfg.timeout_keep_alive_s)
    return _Server(config, app.state.stallfree.engine_loop, on_ready)


@dataclass
class ServerHandle:
    """A server running in a background thread of this process."""

    app: FastAPI
    url: str
    _server: _Server
    _thread: threading.Thread

    @property
    def state(self) -> ServerState:
        return self.app.state.stallfree

    def stop(self, timeout: float = 30.0) -> None:
        """Graceful shutdown (in-flight streams get ``timeout_graceful_shutdown``), then the engine thread."""
        self._server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def start_server(engine_kwargs: dict | None = None, server_cfg: ServerConfig | None = None, *,
                 startup_timeout: float = 120.0) -> ServerHandle:
    """Build the app (``LLMEngine.from_kwargs(**engine_kwargs)``) and serve it from a background thread;
    returns once it accepts connections. ``server_cfg`` defaults to 127.0.0.1 on a free port."""
    cfg = server_cfg or ServerConfig(port=0)
    app = build_app(engine_kwargs, cfg)
    server = uvicorn_server(app, cfg)
    thread = threading.Thread(target=server.run, name="stallfree-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.ready.wait(0.05):
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the server did not start on {cfg.host}:{cfg.port}")
    return ServerHandle(app, f"http://{cfg.host}:{server.port}", server, thread)
