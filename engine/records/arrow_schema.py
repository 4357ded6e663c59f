"""Arrow schemas derived from record dataclasses: one nullable column per field, in field order."""
from __future__ import annotations

import dataclasses
import types
import typing

import pyarrow as pa

ARROW_TYPES = {str: pa.string(), bool: pa.bool_(), int: pa.int64(), float: pa.float64(),
               list[float]: pa.list_(pa.float64())}


def arrow_type(annotation) -> pa.DataType:
    """The Arrow type of a field annotation; ``X | None`` is X (every column is nullable)."""
    if isinstance(annotation, types.UnionType):
        [annotation] = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    return ARROW_TYPES[annotation]


def arrow_schema(record_type: type) -> pa.Schema:
    """One nullable column per dataclass field, in field order."""
    hints = typing.get_type_hints(record_type)
    return pa.schema([(f.name, arrow_type(hints[f.name])) for f in dataclasses.fields(record_type)])


def as_row(record) -> dict:
    """A (non-slots) dataclass instance as a dict that shares its lists: ``dataclasses.asdict`` deep-copies
    every token-time list, which took longer than a simulated run's engine steps."""
    return dict(vars(record))
