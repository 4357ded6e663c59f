"""The characterisation studies of Sarathi-Serve's section 3, each a function of an IterationDriver and its
``study`` config section, returning PhaseRows (presets: conf/experiment/{phases,chunking,tiles}.yaml).

* ``phases``: decode-only batches at a fixed context, prefill-only iterations, hybrid iterations of a chunk
  of c - k prefill tokens plus k decodes;
* ``chunking``: each prompt length prefilled in chunks of each chunk size, and unchunked (chunk = prompt);
* ``tiles``: prefill-only iterations of finely stepped chunk sizes across tile boundaries.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

from stallfree.engine.config_checks import is_int, require
from stallfree.loadgen.studies.driver import IterationDriver
from stallfree.loadgen.studies.table import PhaseRow

SIZE_LISTS = {"phases": ("decode_batch_sizes", "prefill_sizes", "hybrid_chunk_sizes", "hybrid_decodes"),
              "chunking": ("prompt_lengths", "chunk_sizes"), "tiles": ("chunk_sizes",)}


def check_study(study: Mapping) -> None:
    """Raise ConfigError naming the first bad key of a ``study`` section."""
    name = study.get("name")
    require(name in SIZE_LISTS, "study.name", f"one of {sorted(SIZE_LISTS)}", name)
    for key in ("warmup", "repeats"):
        require(is_int(study.get(key)) and study[key] >= (key == "repeats"), f"study.{key}",
                "an integer >= 1" if key == "repeats" else "an integer >= 0", study.get(key))
    for key in SIZE_LISTS[name]:
        sizes = study.get(key)
        require(isinstance(sizes, list) and bool(sizes) and all(is_int(s) and s >= 1 for s in sizes),
                f"study.{key}", "a non-empty list of integers >= 1", sizes)
    if name == "phases":
        require(is_int(study.get("decode_context")) and study["decode_context"] >= 2, "study.decode_context",
                "an integer >= 2", study.get("decode_context"))
        small = min(study["hybrid_chunk_sizes"])
        require(max(study["hybrid_decodes"]) < small, "study.hybrid_decodes",
                f"below the smallest hybrid chunk size ({small})", study["hybrid_decodes"])


def _fit(sizes: list[int], limit: int, key: str, say: Callable[[str], None]) -> list[int]:
    """``sizes`` capped at the model's longest prompt (said once), without repeats."""
    if max(sizes) > limit:
        say(f"study.{key}: sizes above {limit} tokens (the model's max_model_len - 1) run at {limit}")
    return sorted({min(s, limit) for s in sizes})


def phases(driver: IterationDriver, study: Mapping, say: Callable[[str], None]) -> list[PhaseRow]:
    rows = []
    for records in driver.decode_batches(study["decode_batch_sizes"], study["decode_context"]).values():
        rows += [PhaseRow.of("phases", "decode", i, r) for i, r in enumerate(records)]
    for tokens in _fit(study["prefill_sizes"], driver.max_prompt, "prefill_sizes", say):
        rows += [PhaseRow.of("phases", "prefill", i, r, chunk_size=tokens) for i, r in enumerate(driver.prefill(tokens))]
    for chunk in study["hybrid_chunk_sizes"]:
        for decodes in study["hybrid_decodes"]:
            records = driver.hybrid(chunk, decodes, study["decode_context"])
            rows += [PhaseRow.of("phases", "hybrid", i, r, chunk_size=chunk) for i, r in enumerate(records)]
    return rows


def chunking(driver: IterationDriver, study: Mapping, say: Callable[[str], None]) -> list[PhaseRow]:
    rows = []
    for prompt in _fit(study["prompt_lengths"], driver.max_prompt, "prompt_lengths", say):
        for chunk in sorted({c for c in study["chunk_sizes"] if c < prompt} | {prompt}):
            for i, records in enumerate(driver.chunked_prefill(prompt, chunk)):
                rows += [PhaseRow.of("chunking", "chunk", i, r, chunk_size=chunk, prompt_tokens=prompt)
                         for r in records]
    return rows


def tiles(driver: IterationDriver, study: Mapping, say: Callable[[str], None]) -> list[PhaseRow]:
    rows = []
    for tokens in _fit(study["chunk_sizes"], driver.max_prompt, "chunk_sizes", say):
        rows += [PhaseRow.of("tiles", "tile", i, r, chunk_size=tokens) for i, r in enumerate(driver.prefill(tokens))]
    return rows


STUDIES = {"phases": phases, "chunking": chunking, "tiles": tiles}
