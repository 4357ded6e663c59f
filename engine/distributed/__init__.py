"""The engine across processes: one process per rank joined by torch.distributed (gloo on CPU, NCCL on CUDA).

The driver (rank 0, the engine's own process) broadcasts each iteration's SchedulerOutput to the workers,
runs its own shard and samples; the workers run their shards on what they receive (docs/engine.md,
"Parallelism"). Nothing here is imported while ``tensor_parallel_size`` and ``pipeline_parallel_size`` are 1.
"""
