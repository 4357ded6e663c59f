"""Attention time: prefill chunks over their context, decodes over their KV lengths.

Grounding: Vidur's older A100 profile (``attention/a100.csv``: FlashAttention, LLaMA2-70B at TP2, i.e. 32
query and 4 KV heads of 128 dims per GPU; prefill chunks of 64-4096 tokens after 0-4032 cached ones,
decode batches of 1-128 sequences of 32-4032 tokens). Fitted on it, weighting each point by 1/time
(relative error):

* prefill, one launch for all the chunks of an iteration:
  ``a + sum over chunks of (c * u_tok + 4 c p H D / F_cross + 4 c (c+1)/2 H D / F_causal)``, c the chunk's new
  tokens, p its cached tokens, H D the GPU's query heads x head_dim. F_cross and F_causal are the
  achieved FLOP/s on the chunk-vs-cache and the causal chunk-vs-itself parts; u_tok a per-token cost.
* decode, one launch for all decodes: ``a + bytes / B``, bytes = the K and V the decodes read (the sum
  of their context lengths x 2 x KV heads per GPU x head_dim x 2 bytes), B the achieved bandwidth.

Other GPUs: the same fractions of their published peak bf16 FLOP/s (prefill) and memory bandwidth
(decode) as on the A100; fixed launch costs unchanged. Other head counts: the work terms scale with the
GPU's heads x head_dim (FlashAttention's efficiency at head_dim 64, Falcon's, is assumed the same).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from stallfree.engine.simulator.hardware import GPUS, GPUSpec
from stallfree.engine.simulator.ops import profile_data

PROFILE = "attention/a100.csv.gz"
PROFILE_GPU = "a100"
PROFILE_HEADS = 64 // 2       # query heads per GPU in the profile (LLaMA2-70B, TP2)
PROFILE_KV_HEADS = 8 // 2
PROFILE_HEAD_DIM = 128
DTYPE_BYTES = 2


@dataclass(frozen=True)
class AttentionFit:
    """Coefficients on the profiled GPU and heads; seconds."""
    prefill_launch_s: float
    prefill_per_token_s: float
    prefill_cross_tflops: float   # achieved on chunk tokens x cached tokens
    prefill_causal_tflops: float  # achieved on the chunk's causal triangle
    decode_launch_s: float
    decode_gbps: float            # achieved on the K and V the decodes read
    prefill_fit_error: dict
    decode_fit_error: dict


def _relative_fit(features: list[list[float]], seconds: list[float]) -> tuple[np.ndarray, dict]:
    x, t = np.asarray(features, dtype=float), np.asarray(seconds, dtype=float)
    coef = np.linalg.lstsq(x / t[:, None], np.ones(len(t)), rcond=None)[0]
    err = np.abs(x @ coef / t - 1) * 100
    return coef, {"points": len(t), "median_abs_pct": round(float(np.median(err)), 1),
                  "p90_abs_pct": round(float(np.quantile(err, 0.9)), 1)}


@functools.cache
def profile_fit() -> AttentionFit:
    hd = PROFILE_HEADS * PROFILE_HEAD_DIM
    prefill, prefill_s, decode, decode_s = [], [], [], []
    for row in profile_data.rows(PROFILE):
        if row["is_prefill"] == "True":
            c, p = int(row["prefill_chunk_size"]), int(row["kv_cache_size"])
            prefill.append([1.0, c * hd, 4 * c * p * hd, 4 * c * (c + 1) / 2 * hd])
            prefill_s.append(profile_data.ms(row["time_stats.attn_prefill.median"]))
        else:
            kv_bytes = int(row["batch_size"]) * int(row["kv_cache_size"]) * 2 * PROFILE_KV_HEADS * PROFILE_HEAD_DIM * DTYPE_BYTES
            decode.append([1.0, kv_bytes])
            decode_s.append(profile_data.ms(row["time_stats.attn_decode.median"]))
    (a, per_tok, cross, causal), prefill_err = _relative_fit(prefill, prefill_s)
    (da, per_byte), decode_err = _relative_fit(decode, decode_s)
    return AttentionFit(float(a), float(per_tok) * hd, float(1e-12 / cross), float(1e-12 / causal), float(da),
                        float(1e-9 / per_byte), prefill_err, decode_err)


@dataclass(frozen=True)
class AttentionModel:
    """Attention of one layer on one GPU of the TP group, for a GPU and the GPU's share of the heads."""
    prefill_launch_s: float
    per_token_s: float          # per new prefill token
    per_cross_pair_s: float     # per (new token, cached token) pair
    per_causal_pair_s: float    # per (new token, earlier-or-same new token) pair
    decode_launch_s: float
    per_context_token_s: float  # per cached token a decode reads

    @classmethod
    def build(cls, gpu: GPUSpec, heads_per_gpu: int, kv_heads_per_gpu: int, head_dim: int) -> AttentionModel:
        fit, base = profile_fit(), GPUS[PROFILE_GPU]
        compute = base.peak_tflops_bf16 / gpu.peak_tflops_bf16   # same fraction of the peak as the A100
        bandwidth = base.mem_bandwidth_gbps / gpu.mem_bandwidth_gbps
        hd = heads_per_gpu * head_dim
        return cls(prefill_launch_s=fit.prefill_launch_s,
                   per_token_s=fit.prefill_per_token_s * hd / (PROFILE_HEADS * PROFILE_HEAD_DIM) * compute,
                   per_cross_pair_s=4 * hd / (fit.prefill_cross_tflops * 1e12) * compute,
                   per_causal_pair_s=4 * hd / (fit.prefill_causal_tflops * 1e12) * compute,
                   decode_launch_s=fit.decode_launch_s,
                   per_context_token_s=2 * kv_heads_per_gpu * head_dim * DTYPE_BYTES / (fit.decode_gbps * 1e9)
                   * bandwidth)

    def prefill_seconds(self, chunks: tuple[tuple[int, int], ...]) -> float:
        """(new tokens, cached tokens) of each chunk -> seconds of their attention (0 for none)."""
        if not chunks:
            return 0.0
        total = self.prefill_launch_s
        for c, p in chunks:
            total += c * (self.per_token_s + p * self.per_cross_pair_s + (c + 1) * 0.5 * self.per_causal_pair_s)
        return total

    def decode_seconds(self, num_decodes: int, context_tokens: int) -> float:
        """Seconds of the decodes' attention, reading ``context_tokens`` cached tokens in all (0 for none)."""
        return self.decode_launch_s + context_tokens * self.per_context_token_s if num_decodes else 0.0
