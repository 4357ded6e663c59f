"""Running Locust as a user does (``locust -f loadgen/locust/locustfile.py``, a subprocess: it monkeypatches with
gevent on import) and reading what it wrote."""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from tests.helpers.paths import LOCUSTFILE

LOCUST = Path(sys.executable).with_name("locust")


def locust_command(host: str, *args: str) -> list[str]:
    return [str(LOCUST), "-f", str(LOCUSTFILE), "--host", host, "--loglevel", "WARNING", *args]


def locust_stats(out: Path) -> pd.DataFrame:
    return pd.read_csv(out / "locust_stats.csv").set_index("Name")


def llm_stats(out: Path) -> tuple[pd.DataFrame, pd.Series]:
    """The LLM tab's statistics a headless run wrote: (one row per window, the whole-run row)."""
    table = pd.read_csv(out / "locust_llm.csv", keep_default_na=False)
    return table.iloc[:-1], table.iloc[-1]
