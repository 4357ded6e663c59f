"""Import layering of loadgen and analysis: no import cycle, nothing imports the bench entry point,
only the engine's public API, and analysis never reaches the engine."""
import pytest

grimp = pytest.importorskip("grimp")

ENGINE_PUBLIC = {"engine", "engine.hydra_groups", "engine.server"}


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("loadgen", "analysis", "engine")


def test_no_import_cycle_in_loadgen(graph):
    modules = sorted(m for m in graph.modules if m.startswith("loadgen."))
    for module in modules:
        for imported in graph.find_modules_directly_imported_by(module):
            if imported.startswith("loadgen."):
                assert not graph.chain_exists(imported, module), f"cycle: {module} <-> {imported}"


def test_nothing_imports_the_entry_point(graph):
    assert graph.find_modules_that_directly_import("loadgen.bench") == set()


def test_loadgen_uses_only_the_public_engine_api(graph):
    for module in (m for m in graph.modules if m.startswith("loadgen")):
        deeper = {m for m in graph.find_modules_directly_imported_by(module)
                  if m.split(".")[0] == "engine" and m not in ENGINE_PUBLIC}
        assert not deeper, f"{module} imports {deeper}"


def test_analysis_never_imports_the_engine(graph):
    for module in (m for m in graph.modules if m.startswith("analysis")):
        assert not graph.chain_exists(module, "engine", as_packages=True), module
