"""The SLO fields of a run's summary: an absolute TBT bound, or a multiple of the decode iteration time,
which a short decode-only probe measures once per model / target / probe shape."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from omegaconf import DictConfig

from loadgen.bench_config import digest, section
from loadgen.live_target import LiveTarget
from loadgen.workload import build_workload


def decode_iteration_ms(cfg: DictConfig, exp_dir: Path, targets: LiveTarget) -> float:
    """Median decode-only iteration time: the token gaps of a burst of short-prompt requests that
    decode together. Measured once per model / target / probe shape and cached in exp_dir/.probes/."""
    p = cfg.decode_probe
    key = {"model": section(cfg, "model"), "target": cfg.target.kind, "url": cfg.target.get("url"),
           "probe": section(cfg, "decode_probe")}
    path = exp_dir / ".probes" / f"decode-{digest(key)}.json"
    if path.is_file():
        return json.loads(path.read_text())["decode_iter_ms"]
    target = targets.get(cfg, exp_dir / ".logs")
    lengths = {"kind": "fixed", "prompt": p.prompt_tokens, "output": p.output_tokens}
    specs = build_workload({"kind": "burst"}, lengths, p.num_seqs, cfg.seed, target.vocab_size)
    records = target.replay(specs, warmup=0, progress=None).records
    gaps = [np.diff(r.server_token_times or r.token_times) for r in records if r.status == "ok"]
    gaps = np.concatenate([np.empty(0), *gaps])
    if not len(gaps):
        raise RuntimeError(f"decode probe got no token gaps: {[r.error for r in records]}")
    value = float(np.median(gaps) * 1e3)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"decode_iter_ms": value, **key}, indent=2) + "\n")
    tmp.replace(path)
    return value


def resolve_slo(cfg: DictConfig, exp_dir: Path, targets: LiveTarget) -> dict:
    """SLO fields of the summary: slo_name, slo_tbt_ms (absolute or tbt_multiple x decode_iter_ms)."""
    if cfg.slo.tbt_ms is not None:
        return {"slo_name": cfg.slo.name, "slo_tbt_ms": float(cfg.slo.tbt_ms), "decode_iter_ms": None}
    decode_ms = decode_iteration_ms(cfg, exp_dir, targets)
    return {"slo_name": cfg.slo.name, "slo_tbt_ms": cfg.slo.tbt_multiple * decode_ms,
            "decode_iter_ms": decode_ms}
