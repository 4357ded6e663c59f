"""The field tables of the contracts in docs/*.md, generated from the dataclasses that define them.

A table sits between ``<!-- fields: module.Class -->`` and ``<!-- /fields -->``; its rows are the
class's fields in order, with their type and the comment written beside (or just above) each field.
``python -m tests.helpers.doc_fields --write`` (``make docs``) regenerates every table in place;
``tests/docs/test_docs.py`` fails when a table differs from what its class says.
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TABLE = re.compile(r"(<!-- fields: (?P<name>[\w.]+) -->\n)(?P<body>.*?)(<!-- /fields -->)", re.S)


def module_source(module: str) -> Path:
    """The file of a module of this repository, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise LookupError(f"no module {module}")
    return Path(spec.origin)


def field_rows(qualified: str) -> list[tuple[str, str, str]]:
    """(name, type, comment) of each annotated field of a class, read from its source. A field whose type
    is a class of the same module (EngineConfig's sections) stands for that class's fields, named
    ``<field>.<its field>`` (the Hydra keys ``model.dtype``, ``cache.block_size``, ...)."""
    module, _, cls = qualified.rpartition(".")
    path = module_source(module)
    lines = path.read_text().splitlines()
    tree = ast.parse("\n".join(lines))
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    if cls not in classes:
        raise LookupError(f"no class {cls} in {path.relative_to(ROOT)}")
    rows = []
    for stmt in classes[cls].body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        annotation = ast.unparse(stmt.annotation)
        if annotation in classes and annotation != cls:
            rows += [(f"{stmt.target.id}.{name}", kind, comment)
                     for name, kind, comment in field_rows(f"{module}.{annotation}")]
        else:
            rows.append((stmt.target.id, annotation, _comment(lines, stmt)))
    return rows


def _comment(lines: list[str], stmt: ast.AnnAssign) -> str:
    """The comment after the field on its last line, else the comment lines right above it."""
    last = lines[stmt.end_lineno - 1]
    if "#" in last and (comment := last.split("#", 1)[1].strip()):
        return comment
    above = []
    for line in reversed(lines[:stmt.lineno - 1]):
        if not line.strip().startswith("#"):
            break
        above.insert(0, line.strip().lstrip("#").strip())
    return " ".join(above)


def render(qualified: str) -> str:
    rows = ["| field | type | meaning |", "|---|---|---|"]
    for name, annotation, comment in field_rows(qualified):
        rows.append(f"| `{name}` | `{annotation}` | {comment.replace('|', '/')} |")
    return "\n".join(rows) + "\n"


def regenerate(text: str) -> str:
    return TABLE.sub(lambda m: m.group(1) + render(m.group("name")) + m.group(4), text)


def stale_tables(docs: list[Path]) -> list[str]:
    """The tables whose text differs from their class, as "docs/NAME.md: module.Class"."""
    stale = []
    for path in docs:
        text = path.read_text()
        for match in TABLE.finditer(text):
            if match.group("body") != render(match.group("name")):
                shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                stale.append(f"{shown}: {match.group('name')}")
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the tables in place")
    args = parser.parse_args(argv)
    docs = sorted((ROOT / "docs").glob("*.md"))
    if args.write:
        for path in docs:
            path.write_text(regenerate(path.read_text()))
        return 0
    stale = stale_tables(docs)
    for line in stale:
        print(f"stale field table: {line} (python -m tests.helpers.doc_fields --write)")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
