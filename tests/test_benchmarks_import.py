"""Every benchmark script imports on a CPU machine and parses --help, so none rots between the runs that
produce benchmarks/results/ (they need minutes, a peer server or a GPU, so the suite does not run them)."""
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_imports_and_has_a_cli(name, capsys, monkeypatch):
    module = importlib.import_module(f"benchmarks.{name}")
    assert module.__doc__, f"benchmarks/{name}.py says what it measures"
    monkeypatch.setattr("sys.argv", [name, "--help"])
    with pytest.raises(SystemExit) as exit_info:
        module.main()
    assert exit_info.value.code == 0
    assert "usage" in capsys.readouterr().out.lower()
