"""Architecture rules (docs/architecture.md): import contracts, no import cycles, small
source files, and no reference to a file outside the repository."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("engine", "loadgen", "analysis")
PACKAGES = tuple(f"stallfree.{f}" for f in FOLDERS)  # as installed (setup.py)
MAX_LINES = 300


def test_import_contracts():
    """The contracts of pyproject.toml [tool.importlinter], checked by import-linter."""
    lint_imports = Path(sys.executable).parent / "lint-imports"
    if not lint_imports.exists():
        pytest.skip(f"{lint_imports} not installed (pip install -e '.[dev]')")
    proc = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"lint-imports failed:\n{proc.stdout}\n{proc.stderr}"


def test_engine_core_contract_lists_every_core_module():
    """The engine-core contract names its source modules one by one: a new engine module must be added."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if c["id"] == "engine-core")
    listed = set(contract["source_modules"])
    top_level = {p.stem if p.suffix == ".py" else p.name for p in (ROOT / "engine").iterdir()
                 if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    unlisted = sorted(f"stallfree.engine.{m}" for m in top_level - {"server"}
                      if f"stallfree.engine.{m}" not in listed)
    assert not unlisted, f"engine modules missing from the engine-core contract in pyproject.toml: {unlisted}"


def _find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph, as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the DFS stack, 2: done
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := dfs(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := dfs(node)):
            return found
    return None


def test_no_import_cycle():
    """grimp finds every import, also those inside functions and under ``if TYPE_CHECKING``: none makes a
    cycle (a type two modules share lives in one of them)."""
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    edges = {importer: set(graph.find_modules_directly_imported_by(importer)) for importer in graph.modules}
    cycle = _find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_nothing_imports_the_bench_entry_point():
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    assert graph.find_modules_that_directly_import("stallfree.loadgen.sweep.bench") == set()


def test_source_files_are_small():
    offenders = []
    for top in ("engine", "loadgen", "analysis", "benchmarks", "tests"):
        for path in sorted((ROOT / top).rglob("*.py")):
            n = len(path.read_text().splitlines())
            if n > MAX_LINES:
                offenders.append(f"{path.relative_to(ROOT)}: {n} lines")
    assert not offenders, f"source files over {MAX_LINES} lines:\n" + "\n".join(offenders)


def _tracked_text_files() -> list[Path]:
    """Text files git tracks or would track (untracked but not ignored)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    files = []
    for name in out.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        files.append(path)
    return files


def test_no_reference_outside_the_repository():
    this_file = Path(__file__).resolve()
    offenders = []
    for path in _tracked_text_files():
        if path.resolve() == this_file:
            continue  # names the patterns it looks for
        text = path.read_text(errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            if "DESIGN.md" in line or "../shared" in line:
                offenders.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()[:120]}")
    assert not offenders, "references to files outside the repository:\n" + "\n".join(offenders)


def test_module_names_say_one_thing():
    """No two modules of the packages share a file name (``__init__`` and the ``base`` of a registry
    apart): a name such as ``runner`` or ``metrics`` must say which one it is."""
    seen: dict[str, list[str]] = {}
    for top in FOLDERS:
        for path in (ROOT / top).rglob("*.py"):
            if path.stem not in ("__init__", "base"):
                seen.setdefault(path.stem, []).append(str(path.relative_to(ROOT)))
    shared = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not shared, f"module names used twice: {shared}"
