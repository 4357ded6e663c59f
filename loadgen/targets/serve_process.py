"""A ``stallfree-serve`` process for a bench run: the run's engine, every field
(engine.hydra_config.serve_overrides), on ``target.host`` / ``target.port`` (0: a free port), logging to
``<log_dir>/server-<port>.log``; started and answering on enter, stopped on exit (server_process.py)."""
from __future__ import annotations

import sys
from pathlib import Path

from stallfree.engine.config_checks import ConfigError
from stallfree.engine.hydra_config import serve_overrides
from stallfree.loadgen.config.schema import BenchConfig
from stallfree.loadgen.targets.server_process import ServerExited, ServerProcess, free_port


class ServeProcess(ServerProcess):
    def __init__(self, cfg: BenchConfig, log_dir: Path):
        t = cfg.target
        port = t.port or free_port(t.host)
        server = {"host": t.host, "port": port, "served_model_name": cfg.model.model}
        exe = Path(sys.executable).with_name("stallfree-serve")
        command = [str(exe) if exe.exists() else "stallfree-serve",
                   *serve_overrides(cfg.engine_sections(), server)]
        super().__init__(command, f"http://{t.host}:{port}", log_dir / f"server-{port}.log",
                         startup_timeout_s=t.startup_timeout_s)

    def start(self) -> ServeProcess:
        try:
            return super().start()
        except ServerExited as e:  # a server that cannot start on the run's config: a config error (exit 2)
            raise ConfigError(f"target: {e}") from None
