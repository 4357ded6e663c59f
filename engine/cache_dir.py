"""Where the engine keeps what it builds once per machine: presets, native kernels, cost models, limits."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("STALLFREE_CACHE", Path.home() / ".cache" / "stallfree"))
