"""``stallfree-serve``: an OpenAI-compatible HTTP server over one LLMEngine (FastAPI + uvicorn).

Command line (Hydra overrides of conf/serve.yaml, which reuses the ``model/`` and ``scheduler/`` groups):
    stallfree-serve scheduler=sarathi chunk_size=512 model=small port=8000 [--api-key KEY]

In process (tests, the bench harness):
    with start_server({"model": "tiny", "dtype": "float32"}) as server:   # a free port by default
        httpx.get(server.url + "/health")
"""
from __future__ import annotations

import asyncio
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from engine.config import engine_kwargs_from_groups
from engine.server_app import ServerConfig, ServerState, build_app
from engine.server_loop import EngineLoop

__all__ = ["ServerConfig", "ServerHandle", "build_app", "main", "start_server"]

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
CONFIG_NAME = "serve"
USAGE = """usage: stallfree-serve [KEY=VALUE ...] [--api-key KEY] [--host HOST] [--port PORT]

Hydra overrides of conf/serve.yaml, e.g.
  stallfree-serve scheduler=sarathi chunk_size=512 model=small port=8000
  stallfree-serve model=path model.path=/ckpt/llama scheduler=vllm api_key=secret
Groups: model (tiny, small, path), scheduler (vllm, orca, faster_transformer, sarathi, chunked_prefill).
Server keys: host, port (0: a free port), api_key, max_waiting, max_body_bytes, served_model_name,
timeout_graceful_shutdown, log_level. Prints a "ready" line once it listens; SIGTERM stops it."""
FLAGS = {"--api-key": "api_key", "--host": "host", "--port": "port"}
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


def _uvicorn_server(app: FastAPI, cfg: ServerConfig, on_ready: Callable[[_Server], None] | None = None) -> _Server:
    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level, access_log=False,
                            timeout_graceful_shutdown=cfg.timeout_graceful_shutdown)
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
    server = _uvicorn_server(app, cfg)
    thread = threading.Thread(target=server.run, name="stallfree-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.ready.wait(0.05):
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the server did not start on {cfg.host}:{cfg.port}")
    return ServerHandle(app, f"http://{cfg.host}:{server.port}", server, thread)


# -- command line ----------------------------------------------------------------------------------


def _overrides(args: list[str]) -> list[str]:
    """Hydra overrides, with ``--api-key KEY`` / ``--port=N`` style flags turned into ``key=value``."""
    out, rest = [], iter(args)
    for arg in rest:
        flag, eq, value = arg.partition("=")
        if flag in FLAGS:
            value = value if eq else next(rest, None)
            if value is None:
                raise ValueError(f"{flag} needs a value")
            out.append(f"{FLAGS[flag]}={_quoted(value)}")
        elif arg.startswith("-"):
            raise ValueError(f"unknown option {arg!r} (see --help)")
        else:
            out.append(arg)
    return out


def _quoted(value: str) -> str:
    """A Hydra override value taken literally (commas, '=', quotes ...); port is cast back to int below."""
    # Hydra's rule: a quote and any backslashes right before a quote or the end get a backslash each
    return "'" + re.sub(r"(\\*)('|$)", lambda m: m[1] * 2 + ("\\'" if m[2] else ""), value) + "'"


def _configs(args: list[str]) -> tuple[dict, ServerConfig]:
    """Compose conf/serve.yaml with the overrides: (engine kwargs, server config)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None, job_name="stallfree-serve"):
        cfg = OmegaConf.to_container(compose(config_name=CONFIG_NAME, overrides=_overrides(args)), resolve=True,
                                     throw_on_missing=True)
    m, s = cfg["model"], cfg["scheduler"]
    engine_kwargs = engine_kwargs_from_groups(m, s, cfg["chunk_size"])
    port = cfg["port"]
    server_cfg = ServerConfig(
        host=str(cfg["host"]), port=int(port) if isinstance(port, str) and port.isdigit() else port,
        api_key=None if cfg["api_key"] is None else str(cfg["api_key"]), max_waiting=cfg["max_waiting"],
        max_body_bytes=cfg["max_body_bytes"], served_model_name=cfg["served_model_name"] or str(m["name"]),
        timeout_graceful_shutdown=cfg["timeout_graceful_shutdown"], log_level=cfg["log_level"])
    server_cfg.validate()
    for key in ("chunk_size", "max_num_seqs", "max_num_batched_tokens"):
        value = engine_kwargs[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{key} must be an integer >= 1, got {value!r}")
    return engine_kwargs, server_cfg


def _one_line(exc: BaseException) -> str:
    from omegaconf.errors import OmegaConfBaseException

    text = str(exc).split("Config search path")[0]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if isinstance(exc, OmegaConfBaseException) and lines:
        return f"{exc.full_key}: {lines[0]}" if exc.full_key else lines[0]
    return " ".join(lines) or type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if {"-h", "--help"} & set(args):
        print(USAGE)
        return 0
    try:
        engine_kwargs, cfg = _configs(args)
        app = build_app(engine_kwargs, cfg)
    except Exception as exc:  # any bad value: one line, no traceback
        print(f"stallfree-serve: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    server = _uvicorn_server(app, cfg, on_ready=lambda s: print(
        f"stallfree-serve ready: http://{cfg.host}:{s.port} model={engine_kwargs['model']} "
        f"scheduler={engine_kwargs['scheduler']} chunk_size={engine_kwargs['chunk_size']}", flush=True))
    # uvicorn handles SIGTERM / SIGINT itself (graceful shutdown) and re-raises the signal afterwards:
    # these no-op handlers make that re-raise end in a clean exit 0 instead of a kill or a traceback.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    server.run()
    print("stallfree-serve: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
