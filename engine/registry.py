"""The one registration mechanism for the implementations a setting chooses among (scheduler policies,
attention backends, runners, clocks, load-generator targets): each registers under its name with
``@REGISTRY.register(name)``; looking up another name is a one-line error naming the setting and the
choices. Needs no torch, so the load generator uses it too."""
from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Generic, TypeVar

from stallfree.engine.config_checks import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """``key`` is the setting that names an entry. ``modules`` maps names to the module that registers
    them, imported on first lookup: an entry whose module imports torch, or this registry's package,
    costs nothing until it is used. ``resolved_by_caller`` are further accepted names the caller maps to
    an entry (``auto``); the error lists them among the choices."""

    def __init__(self, key: str, modules: Mapping[str, str] | None = None, resolved_by_caller: tuple[str, ...] = ()):
        self.key, self.resolved_by_caller = key, resolved_by_caller
        self.entries: dict[str, T] = {}
        self.modules = dict(modules or {})

    def register(self, name: str) -> Callable[[T], T]:
        def add(entry: T) -> T:
            self.entries[name] = entry
            return entry

        return add

    def names(self) -> list[str]:
        return sorted(self.entries.keys() | self.modules.keys())

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __contains__(self, name: object) -> bool:
        return name in self.entries or name in self.modules

    def __getitem__(self, name: str) -> T:
        if name not in self.entries and name in self.modules:
            importlib.import_module(self.modules[name])
        if name not in self.entries:
            choices = ", ".join([*self.resolved_by_caller, *self.names()])
            raise ConfigError(f"unknown {self.key} {name!r}; choose one of {choices}")
        return self.entries[name]
