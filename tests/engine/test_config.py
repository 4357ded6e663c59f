"""The engine's config sections check their ranges where they are made: LLM(...)'s keyword arguments get the
one-line ConfigError a composed config gets, naming the key."""
import pytest

from stallfree.engine import EngineConfig
from stallfree.engine.config_checks import ConfigError


@pytest.mark.parametrize("kwargs, message", [
    ({"chunk_size": 0}, "scheduler.chunk_size must be an integer >= 1, got 0"),
    ({"watermark": 1.0}, r"cache.watermark must be a number in \[0, 1\), got 1.0"),
    ({"kv_memory_gib": float("nan")}, "cache.kv_memory_gib must be a number > 0, got nan"),
    ({"max_model_len": 1}, "model.max_model_len must be an integer >= 2 or null, got 1"),
    ({"dtype": ""}, "model.dtype must be a non-empty string, got ''"),
    ({"tensor_parallel_size": 0}, "parallel.tensor_parallel_size must be an integer >= 1, got 0"),
])
def test_an_out_of_range_keyword_is_a_config_error_naming_its_key(kwargs, message):
    with pytest.raises(ConfigError, match=f"^{message}$"):
        EngineConfig.from_kwargs(**kwargs)

