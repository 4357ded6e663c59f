"""ServerConfig: how stallfree-serve listens, limits and authenticates (the ``server.*`` keys)."""
from __future__ import annotations

from dataclasses import dataclass

from stallfree.engine.config_checks import is_int, is_number, require

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
