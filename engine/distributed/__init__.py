"""The engine across processes: one process per rank joined by torch.distributed (gloo on CPU, NCCL on CUDA).

The driver (rank 0, the engine's own process) broadcasts each iteration's SchedulerOutput to the workers,
runs its own shard and samples; the workers run their shards on what they receive (docs/engine.md,
"Parallelism"). Beside the ranks: disaggregated prefill and decode (``remote_prefill.py``) and data-parallel
replicas behind a router (``replicas.py``), each instance an engine in a process of its own. Nothing here is
imported while every ``parallel`` size is 1 and ``disaggregation`` is null.
"""
