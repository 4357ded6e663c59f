"""CUDA graphs of decode-only forward passes, one per batch-size bucket (vLLM style).

A decode-only step of ``n`` sequences replays the graph of the smallest bucket >= n over persistent
input buffers; the rows past ``n`` are padding that writes its K/V into a scratch block no request
owns and reads only that block. Hybrid steps (any prefill chunk) run eagerly. Every bucket is captured
at startup (``capture_all``), largest first into one memory pool that the smaller ones reuse: capture
synchronises the device, and a capture on the serving path would stall the first step of each size.

The bookkeeping (bucket choice, padding, buffer copies, replay counts) runs against the ``Graph``
interface, which tests back with a CPU stand-in; ``CudaGraph`` is the real one.
"""
from __future__ import annotations

import bisect
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Protocol

import torch

from stallfree.engine.attention import AttentionMetadata

log = logging.getLogger(__name__)


def batch_size_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, ... below ``max_num_seqs``, then ``max_num_seqs`` itself."""
    buckets = [1 << i for i in range(max_num_seqs.bit_length()) if 1 << i < max_num_seqs]
    return [*buckets, max_num_seqs]


def bucket_for(num_seqs: int, buckets: list[int]) -> int | None:
    """The smallest bucket that holds ``num_seqs`` sequences; None when none does."""
    i = bisect.bisect_left(buckets, num_seqs)
    return buckets[i] if i < len(buckets) else None


class Graph(Protocol):
    def capture(self, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Record ``forward`` (reading only persistent buffers); return its output tensor, which every
        ``replay`` overwrites."""
        ...

    def replay(self) -> None: ...


class CudaGraph:
    """``torch.cuda.CUDAGraph`` behind ``Graph``; graphs given the same ``pool`` share its memory."""

    def __init__(self, pool):
        self.graph, self.pool = torch.cuda.CUDAGraph(), pool

    def capture(self, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        # Warm up on a side stream first (Triton compiles, cuBLAS picks its kernels), as capture requires.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            forward()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(self.graph, pool=self.pool):
            return forward()

    def replay(self) -> None:
        self.graph.replay()


def cuda_graph_factory() -> Callable[[], Graph]:
    """Makes CUDA graphs that all share one memory pool."""
    pool = torch.cuda.graph_pool_handle()
    return lambda: CudaGraph(pool)


class DecodeGraphs:
    def __init__(self, model, attn_backend, kv_caches, *, max_num_seqs: int, max_blocks_per_seq: int,
                 scratch_block: int, block_size: int, device: torch.device, new_graph: Callable[[], Graph]):
        self.model, self.attn_backend, self.kv_caches, self.new_graph = model, attn_backend, kv_caches, new_graph
        self.buckets = batch_size_buckets(max_num_seqs)
        self.scratch_block, self.block_size = scratch_block, block_size
        n, long = max_num_seqs, dict(dtype=torch.long, device=device)
        self.input_ids, self.positions, self.slot_mapping = (torch.zeros(n, **long) for _ in range(3))
        self.seq_lens = torch.ones(n, **long)
        self.block_tables = torch.full((n, max_blocks_per_seq), scratch_block, **long)
        self.query_start_loc = torch.arange(n + 1, **long)  # one query per sequence
        self.logits_indices = torch.arange(n, **long)
        self.graphs: dict[int, tuple[Graph, torch.Tensor]] = {}
        self.replays: Counter[int] = Counter()  # replays per bucket
        self.capture_seconds = 0.0

    @torch.inference_mode()  # as the steps that replay them: no autograd state recorded into the graphs
    def capture_all(self) -> None:
        """Capture every bucket's graph, largest first (the smaller ones then fit in its pool memory)."""
        start = time.perf_counter()
        for bucket in reversed(self.buckets):
            self._pad(0, bucket)  # every row a padding row: the capture writes only the scratch block
            graph = self.new_graph()
            self.graphs[bucket] = graph, graph.capture(lambda bucket=bucket: self._forward(bucket))
        self.capture_seconds = time.perf_counter() - start
        log.info("captured %d decode CUDA graphs (batch sizes %s) in %.1f s", len(self.buckets),
                 ",".join(map(str, self.buckets)), self.capture_seconds)

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
        graph, logits = self.graphs[bucket]
        graph.replay()
        self.replays[bucket] += 1
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
