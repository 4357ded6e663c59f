"""The GPU deployment simulator: a model shape on a GPU type with tensor and pipeline parallelism, timed by
an operator-level cost model, served by the real schedulers and KV accounting on a virtual clock."""
