"""The vendored GPU profiles (``profiles/``, from microsoft/vidur, see its README.md): read with the
standard library, times converted from Vidur's milliseconds to seconds.

``sources()`` is ``profiles/sources.json``: for every vendored file its repository, commit and original path.
"""
from __future__ import annotations

import csv
import functools
import gzip
import json
from collections.abc import Iterator
from pathlib import Path

PROFILES = Path(__file__).resolve().parent / "profiles"


@functools.cache
def sources() -> dict[str, dict]:
    """Vendored file name -> {file, repository, commit, path, columns, rows}."""
    return {entry["file"]: entry for entry in json.loads((PROFILES / "sources.json").read_text())}


@functools.cache
def rows(name: str) -> tuple[dict[str, str], ...]:
    """The rows of one vendored file (a name as in sources.json), as strings."""
    if name not in sources():
        raise ValueError(f"no vendored profile {name!r}; have {sorted(sources())}")
    with gzip.open(PROFILES / name, "rt", newline="") as f:
        return tuple(csv.DictReader(f))


def compute_files(gpu: str) -> list[str]:
    """The per-model operator profiles of one GPU."""
    return sorted(name for name in sources() if name.startswith(f"compute/{gpu}/"))


def model_name(file: str) -> str:
    """compute/a100/Llama-2-7b-hf.csv.gz -> Llama-2-7b-hf"""
    return file.rsplit("/", 1)[1].removesuffix(".csv.gz")


def ms(value: str) -> float:
    return float(value) * 1e-3


@functools.cache
def compute_points(file: str) -> tuple[dict[int, dict[str, str]], dict[tuple[int, str], dict[int, list[float]]]]:
    """One model's operator profile: (TP -> a row, for the model's config columns; (TP, operator column) ->
    token count -> the seconds measured there). Operator columns are Vidur's names (attn_pre_proj, ...)."""
    config: dict[int, dict[str, str]] = {}
    points: dict[tuple[int, str], dict[int, list[float]]] = {}
    for row in rows(file):
        tp = int(row["num_tensor_parallel_workers"])
        config.setdefault(tp, row)
        for key, value in row.items():
            if key.startswith("time_stats."):
                column = key.removeprefix("time_stats.").removesuffix(".median")
                points.setdefault((tp, column), {}).setdefault(int(row["num_tokens"]), []).append(ms(value))
    return config, points


def profiled_configs(gpu: str, exclude_models: frozenset[str] = frozenset(),
                     ) -> Iterator[tuple[str, int, dict[str, str], dict[tuple[int, str], dict[int, list[float]]]]]:
    """(model, TP, its config row, the model's points) of every profiled model and TP degree on ``gpu``."""
    for file in compute_files(gpu):
        model = model_name(file)
        if model in exclude_models:
            continue
        config, points = compute_points(file)
        for tp, row in sorted(config.items()):
            yield model, tp, row, points
