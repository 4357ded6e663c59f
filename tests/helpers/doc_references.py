"""File and symbol references in the docs, configs and source comments, and whether they exist.

A file reference is a repository path such as ``engine/simulator/simulated_runner.py`` (a ``{a,b}`` group names
several files; ``:123`` or ``:name`` may follow). A symbol reference is a dotted name in backticks that
starts at one of the installed packages (`` `stallfree.engine.server.start_server` ``) or a path followed by
``:name`` (``loadgen/sweep/capacity_search.py:search``). Symbols are looked up in the source without importing it.
"""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "loadgen", "analysis")
TOPS = (*PACKAGES, "conf", "benchmarks", "tests", "docs", ".ci")
# Files that commands write: named in code and comments before they exist.
OUTPUTS = ("benchmarks/results/",)
PLACEHOLDER = re.compile(r"\bNAME\b|<")  # conf/slo/NAME.yaml, gpu_<device>.json
_TOPS = "|".join(re.escape(t) for t in TOPS)
PATH = re.compile(rf"(?<![\w/.-])((?:{_TOPS})/[\w./{{}},*-]*[\w}}*])(?::([A-Za-z_]\w*))?")
BARE_FILE = re.compile(r"`(test_\w+\.py|[\w-]+\.ipynb)`")  # a test file or notebook named alone: somewhere in the tree
SYMBOL = re.compile(rf"`((?:stallfree\.)?(?:{'|'.join(PACKAGES)})(?:\.\w+)+)`")


def expand(path: str) -> list[str]:
    """``a/{b,c}.py`` -> ``a/b.py``, ``a/c.py``."""
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    return [p for alt in match.group(1).split(",")
            for p in expand(path[:match.start()] + alt.strip() + path[match.end():])]


@functools.cache
def defined_names(path: Path) -> frozenset[str]:
    """Top-level names of a module, and Class.attr for class members."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        for name, body in _bindings(node):
            names.add(name)
            for inner in body:
                names.update(f"{name}.{n}" for n, _ in _bindings(inner))
    return frozenset(names)


def _bindings(node: ast.stmt) -> list[tuple[str, list]]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return [(node.name, [])]
    if isinstance(node, ast.ClassDef):
        return [(node.name, node.body)]
    if isinstance(node, ast.Assign):
        return [(t.id, []) for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [(node.target.id, [])]
    if isinstance(node, ast.ImportFrom | ast.Import):
        return [((a.asname or a.name).split(".")[0], []) for a in node.names]
    if isinstance(node, ast.If | ast.Try):
        return [b for child in node.body + getattr(node, "orelse", []) for b in _bindings(child)]
    return []


@functools.cache
def file_names() -> frozenset[str]:
    """The names of the repository's files (outside .git and the virtual environment)."""
    return frozenset(p.name for top in (*TOPS, ".") for p in (ROOT / top).glob("*" if top == "." else "**/*"))


def module_file(dotted: str) -> Path | None:
    """The file of a module named as installed (``stallfree.engine.server``): the folders are the
    distribution's subpackages (setup.py)."""
    if not dotted.startswith("stallfree."):
        return None
    base = ROOT.joinpath(*dotted.split(".")[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def symbol_exists(dotted: str) -> bool:
    """The longest module prefix of ``dotted`` exists and defines the rest (one or two names deep)."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        path = module_file(".".join(parts[:split]))
        if path is None:
            continue
        rest = ".".join(parts[split:])
        return not rest or rest in defined_names(path) or (path.name == "__init__.py" and module_file(dotted) is not None)
    return False


def broken_references(path: Path, text: str, *, outputs_exist: bool = True) -> list[str]:
    """References in ``text`` (from ``path``) to files or symbols that do not exist. A placeholder
    (``conf/slo/NAME.yaml``, ``gpu_<device>.json``) is no reference; with ``outputs_exist`` false,
    files under OUTPUTS are not checked either."""
    broken = []
    for match in PATH.finditer(text):
        ref, name = match.group(1).rstrip("."), match.group(2)
        if PLACEHOLDER.search(text[match.start(1):match.end(1) + 1]):
            continue
        if not outputs_exist and ref.startswith(OUTPUTS):
            continue
        for file in expand(ref):
            if "*" in file:
                if not list(ROOT.glob(file)):
                    broken.append(file)
            elif not (ROOT / file).exists() and not (ROOT / f"{file}.py").exists():  # a module named without .py
                broken.append(file)
            elif name and file.endswith(".py") and name not in defined_names(ROOT / file):
                broken.append(f"{file}:{name}")
    broken += [m.group(1) for m in BARE_FILE.finditer(text) if m.group(1) not in file_names()]
    broken += [m.group(1) for m in SYMBOL.finditer(text) if not symbol_exists(m.group(1))]
    return [f"{path.relative_to(ROOT)}: {ref}" for ref in broken]


def comments(path: Path) -> str:
    """A Python file's comments and docstrings (where references to other files live)."""
    source = path.read_text()
    lines = [line.split("#", 1)[1] for line in source.splitlines() if "#" in line]
    tree = ast.parse(source)
    docs = [ast.get_docstring(n) or "" for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)]
    return "\n".join(lines + docs)
