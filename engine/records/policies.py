"""The scheduling policies' names, in the order figures and tables list them: the one list analysis reads
(it may not import engine.scheduler), held equal to the scheduler registry's names by
tests/engine/records/test_policies.py."""
from __future__ import annotations

POLICIES = ("vllm", "orca", "faster_transformer", "sarathi", "chunked_prefill", "hybrid")
