"""CUDA graphs of decode-only forward passes, one per batch-size bucket (vLLM style).

A decode-only step of ``n`` sequences replays the graph of the smallest bucket >= n over persistent
input buffers; the rows past ``n`` are padding that writes its K/V into a scratch block no request
owns and reads only that block. Hybrid steps (any prefill chunk) run eagerly. A bucket's graph is
captured the first time a step needs it.
"""
from __future__ import annotations

import bisect

import torch

from engine.attention import AttentionMetadata


def batch_size_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, ... below ``max_num_seqs``, then ``max_num_seqs`` itself."""
    buckets = [1 << i for i in range(max_num_seqs.bit_length()) if 1 << i < max_num_seqs]
    return [*buckets, max_num_seqs]


def bucket_for(num_seqs: int, buckets: list[int]) -> int | None:
    """The smallest bucket that holds ``num_seqs`` sequences; None when none does."""
    i = bisect.bisect_left(buckets, num_seqs)
    return buckets[i] if i < len(buckets) else None


class DecodeGraphs:
    def __init__(self, model, attn_backend, kv_caches, *, max_num_seqs: int, max_blocks_per_seq: int,
                 scratch_block: int, block_size: int, device: torch.device):
        self.model, self.attn_backend, self.kv_caches = model, attn_backend, kv_caches
        self.buckets = batch_size_buckets(max_num_seqs)
        self.scratch_block, self.block_size = scratch_block, block_size
        n, long = max_num_seqs, dict(dtype=torch.long, device=device)
        self.input_ids, self.positions, self.slot_mapping = (torch.zeros(n, **long) for _ in range(3))
        self.seq_lens = torch.ones(n, **long)
        self.block_tables = torch.full((n, max_blocks_per_seq), scratch_block, **long)
        self.query_start_loc = torch.arange(n + 1, **long)  # one query per sequence
        self.logits_indices = torch.arange(n, **long)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None  # one memory pool shared by every bucket's graph

    def fits(self, num_seqs: int, num_blocks: int) -> bool:
        return bucket_for(num_seqs, self.buckets) is not None and num_blocks <= self.block_tables.shape[1]

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Logits [n, vocab] of a decode-only step of n sequences."""
        n, width = meta.block_tables.shape
        bucket = bucket_for(n, self.buckets)
        self._pad(n, bucket)
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.seq_lens[:n].copy_(meta.seq_lens)
        self.block_tables[:n, :width].copy_(meta.block_tables)  # entries past a sequence's length go unread
        if bucket not in self.graphs:
            self.graphs[bucket] = self._capture(bucket)
        graph, logits = self.graphs[bucket]
        graph.replay()
        return logits[:n]

    def _pad(self, n: int, bucket: int) -> None:
        self.input_ids[n:bucket] = 0
        self.positions[n:bucket] = 0
        self.slot_mapping[n:bucket] = self.scratch_block * self.block_size
        self.seq_lens[n:bucket] = 1
        self.block_tables[n:bucket, 0] = self.scratch_block

    def _forward(self, bucket: int) -> torch.Tensor:
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:bucket], num_decodes=bucket, prefills=[],
            decode_block_tables=self.block_tables[:bucket], decode_seq_lens=self.seq_lens[:bucket],
            query_start_loc=self.query_start_loc[:bucket + 1], seq_lens=self.seq_lens[:bucket],
            block_tables=self.block_tables[:bucket], max_query_len=1,
            max_seq_len=self.block_tables.shape[1] * self.block_size)
        return self.model(self.input_ids[:bucket], self.positions[:bucket], self.attn_backend, self.kv_caches,
                          meta, self.logits_indices[:bucket])

    def _capture(self, bucket: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # Warm up on a side stream first (Triton compiles, cuBLAS picks its kernels), as capture requires.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._forward(bucket)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self._forward(bucket)
        self.pool = graph.pool()
        return graph, logits
