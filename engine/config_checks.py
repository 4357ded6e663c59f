"""ConfigError and the checks that raise it: one line naming the key, what it must be and what it got.

Every config dataclass (the engine's sections, the bench's groups) and every registry lookup raises it; the
entry points turn it into a one-line message and exit 2. No torch, no Hydra.
"""
from __future__ import annotations

import math


class ConfigError(ValueError):
    """A bad setting; the message starts with the key."""


def require(ok: bool, key: str, rule: str, value: object) -> None:
    """Raise ``ConfigError("<key> must be <rule>, got <value>")`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key} must be {rule}, got {value!r}")


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
