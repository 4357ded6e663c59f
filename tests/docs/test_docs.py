"""The docs say what the code does: every file and symbol they (and the source comments) name exists,
and the contract field tables equal their dataclasses (tests/helpers/doc_fields.py regenerates them)."""
from __future__ import annotations

from tests.helpers.doc_fields import ROOT, field_rows, stale_tables
from tests.helpers.doc_references import broken_references, comments, symbol_exists

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCE_TOPS = ("engine", "loadgen", "analysis", "benchmarks", "tests")


def test_docs_and_configs_name_only_existing_files_and_symbols():
    broken = []
    for path in [*DOCS, *sorted((ROOT / "conf").rglob("*.yaml"))]:
        broken += broken_references(path, path.read_text())
    assert not broken, "references to files or symbols that do not exist:\n" + "\n".join(broken)


def test_source_comments_name_only_existing_files_and_symbols():
    broken = []
    for top in SOURCE_TOPS:
        for path in sorted((ROOT / top).rglob("*.py")):
            broken += broken_references(path, comments(path), outputs_exist=False)
    assert not broken, "comments naming files or symbols that do not exist:\n" + "\n".join(broken)


def test_contract_field_tables_match_the_dataclasses():
    stale = stale_tables(sorted((ROOT / "docs").glob("*.md")))
    assert not stale, "stale field tables (python -m tests.helpers.doc_fields --write):\n" + "\n".join(stale)


def test_the_checks_catch_drift(tmp_path):
    """The checkers themselves: a missing file, a missing symbol and a renamed field are all caught."""
    doc = ROOT / "docs" / "architecture.md"
    assert broken_references(doc, "see engine/nonexistent.py and `stallfree.engine.server.no_such_name`") == [
        "docs/architecture.md: engine/nonexistent.py", "docs/architecture.md: stallfree.engine.server.no_such_name"]
    # a module named as a folder rather than as installed cannot be imported by a reader
    assert broken_references(doc, "`engine.server.start_server`") == ["docs/architecture.md: engine.server.start_server"]
    assert broken_references(doc, "engine/scheduler/{vllm,nope}.py and loadgen/sweep/capacity_search.py:search") == [
        "docs/architecture.md: engine/scheduler/nope.py"]
    assert symbol_exists("stallfree.engine.server.start_server") and symbol_exists("stallfree.engine.records.batch_record.BatchRecord.iteration")
    names = [name for name, _, _ in field_rows("stallfree.engine.records.batch_record.BatchRecord")]
    assert names[:3] == ["iteration", "start_time", "end_time"]
    stale_doc = tmp_path / "x.md"
    stale_doc.write_text("<!-- fields: engine.records.batch_record.BatchRecord -->\n| old |\n<!-- /fields -->\n")
    assert stale_tables([stale_doc]) == [f"{stale_doc}: engine.records.batch_record.BatchRecord"]


def test_the_attention_backend_field_lists_every_backend():
    """The comment of ModelConfig.attention_backend (the engine key's row in docs/engine.md) names every
    backend the engine has."""
    from stallfree.engine.attention import ATTENTION_BACKENDS

    comment = next(comment for name, _, comment in field_rows("engine.config.ModelConfig")
                   if name == "attention_backend")
    assert {"auto", *ATTENTION_BACKENDS} <= set(comment.replace("|", " ").split()), comment
