"""``stallfree-serve``: an OpenAI-compatible HTTP server over one LLMEngine (FastAPI + uvicorn).

Command line (Hydra overrides of conf/serve.yaml, which reuses the ``model/`` and ``scheduler/`` groups and
takes every engine key, ``<section>.<field>`` of EngineConfig):
    stallfree-serve scheduler=sarathi scheduler.chunk_size=512 model=small port=8000 [--api-key KEY]

In process (tests, the bench harness): ``stallfree.engine.server.start_server`` (engine/server/launcher.py).
"""
from __future__ import annotations

import os
import signal
import sys
from dataclasses import fields

from stallfree.engine import EngineConfig
from stallfree.engine.config_checks import require
from stallfree.engine.hydra_config import CONF_DIR, compose, engine_of, one_line, override, typed
from stallfree.engine.server.app import ServerConfig, build_app
from stallfree.engine.server.launcher import uvicorn_server

CONFIG_NAME = "serve"


def _options(group: str) -> str:
    return ", ".join(sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")))


USAGE = f"""usage: stallfree-serve [MODEL_OR_PATH] [KEY=VALUE ...] [--api-key KEY] [--host HOST] [--port PORT]

MODEL_OR_PATH (as `vllm serve`): a model preset, or an HF checkpoint directory (model=path model.model=DIR).
Hydra overrides of conf/serve.yaml, e.g.
  stallfree-serve small scheduler=sarathi scheduler.chunk_size=512 port=8000
  stallfree-serve /ckpt/llama scheduler=vllm cache.block_size=32 --api-key secret
Groups: model ({_options("model")}), scheduler ({_options("scheduler")}).
Engine keys: every field of EngineConfig as <section>.<field> (model.*, cache.*, scheduler.*: the table in
docs/engine.md#configuration; `stallfree-bench --cfg job` prints them with their values).
Server keys: host, port (0: a free port), api_key, metrics_require_api_key, max_waiting, max_body_bytes,
served_model_name, timeout_graceful_shutdown, log_level, body_read_timeout_s, header_read_timeout_s,
timeout_keep_alive_s, batch_history_max_records, batch_history_max_age_s. Prints a "ready" line once it
listens; SIGTERM stops it."""
FLAGS = {"--api-key": "api_key", "--host": "host", "--port": "port"}


# -- command line ----------------------------------------------------------------------------------


def _overrides(args: list[str]) -> list[str]:
    """Hydra overrides, with ``--api-key KEY`` / ``--port=N`` style flags turned into ``key=value``."""
    out, rest = [], iter(args)
    if args and "=" not in args[0] and not args[0].startswith("-"):  # MODEL_OR_PATH
        first = next(rest)
        out += [f"model={first}"] if (CONF_DIR / "model" / f"{first}.yaml").is_file() else [
            "model=path", override("model.model", first)]
    for arg in rest:
        flag, eq, value = arg.partition("=")
        if flag in FLAGS:
            value = value if eq else next(rest, None)
            if value is None:
                raise ValueError(f"{flag} needs a value")
            out.append(override(FLAGS[flag], value))
        elif arg.startswith("-"):
            raise ValueError(f"unknown option {arg!r} (see --help)")
        else:
            out.append(arg)
    return out


def _configs(args: list[str]) -> tuple[EngineConfig, ServerConfig]:
    """Compose conf/serve.yaml with the overrides and check it once: (engine config, server config)."""
    cfg = compose(CONFIG_NAME, _overrides(args), job_name="stallfree-serve")
    engine = engine_of(cfg)
    require(engine.model.clock == "real", "model.clock", "'real' (a server's virtual time means nothing to a client)",
            engine.model.clock)
    server = typed(ServerConfig, {f.name: cfg[f.name] for f in fields(ServerConfig)})
    server.served_model_name = server.served_model_name or engine.model.model
    server.validate()
    return engine, server


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if {"-h", "--help"} & set(args):
        print(USAGE)
        return 0
    try:
        engine, cfg = _configs(args)
        app = build_app(engine, cfg)
    except KeyboardInterrupt:  # Ctrl-C while the model loads
        print("stallfree-serve: interrupted while loading the model", file=sys.stderr, flush=True)
        # The engine thread may still be inside native code (a kernel build, torch's loading): ending the
        # interpreter around it aborts the process ("terminate called ..."), so leave at once.
        os._exit(130)
    except Exception as exc:  # any bad value: one line, no traceback
        print(f"stallfree-serve: error: {one_line(exc)}", file=sys.stderr)
        return 2
    dtype = app.state.stallfree.engine_loop.engine.dtype_choice
    kernels = app.state.stallfree.engine_loop.engine.linear_kernels
    server = uvicorn_server(app, cfg, on_ready=lambda s: print(
        f"stallfree-serve ready: http://{cfg.host}:{s.port} model={engine.model.model} "
        f"scheduler={engine.scheduler.policy} chunk_size={engine.scheduler.chunk_size} dtype={dtype}"
        + (f" linears={kernels}" if kernels else ""), flush=True))
    # uvicorn handles SIGTERM / SIGINT itself (graceful shutdown) and re-raises the signal afterwards:
    # these no-op handlers make that re-raise end in a clean exit 0 instead of a kill or a traceback.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    engine_loop = app.state.stallfree.engine_loop
    engine_loop.on_death = lambda: setattr(server, "should_exit", True)  # e.g. a worker process died
    try:
        server.run()
    finally:  # main() called in a process that goes on (tests) gets its handlers back
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if engine_loop.error is not None:
        print(f"stallfree-serve: stopped: {engine_loop.error}", file=sys.stderr, flush=True)
        return 1
    print("stallfree-serve: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
