"""The house of docs/architecture.md, as the source tree really is.

`nox -s lint` runs import-linter on the static imports (pyproject.toml's contracts). These tests add
what it cannot see or does not check: every top-level entry of src/agenttune sits in a layer (a module
added outside every layer fails here), imports by name (`importlib.import_module("agenttune...")`,
`load_reference("agenttune...:Name")`, lazy `_WHERE` tables) never climb to a higher layer, the module
graph has no cycle, and every path docs/architecture.md names exists.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "agenttune"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
# Entries of src/agenttune that are not modules of a layer: the package's own face and package data.
NOT_LAYERED = {"__init__.py", "py.typed"}


def layers() -> list[set[str]]:
    """The layers contract of pyproject.toml, highest first: each a set of top-level module names."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    [contract] = [contract for contract in contracts if contract["type"] == "layers"]
    return [{name.strip() for name in layer.split("|")} for layer in contract["layers"]]


def layer_of(module: str, order: list[set[str]]) -> int | None:
    """Index of the layer holding `module` (0 is the top), by its longest listed prefix."""
    best: tuple[int, int] | None = None
    for index, layer in enumerate(order):
        for name in layer:
            if (module == name or module.startswith(name + ".")) and (best is None or len(name) > best[1]):
                best = (index, len(name))
    return None if best is None else best[0]


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, bool]]:
    """(imported agenttune module, by name?) for every import in the file, function-local and
    TYPE_CHECKING ones included; `by name` for import_module / load_reference / lazy-table strings."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, bool]] = []

    def add(module: str, by_name: bool = False) -> None:
        while module and module not in known:  # `agenttune.x.Name` -> agenttune.x
            module = module.rpartition(".")[0]
        if module.startswith("agenttune"):
            found.append((module, by_name))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            add(base)  # `from package import module` runs the package's __init__ first
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    add(f"{base}.{alias.name}")
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            function = ast.unparse(node.func)
            value = node.args[0].value
            if isinstance(value, str) and function.split(".")[-1] in ("import_module", "load_reference", "__import__"):
                add(value.split(":")[0], by_name=True)
        elif isinstance(node, ast.Assign) and any(isinstance(target, ast.Name) and target.id in ("_WHERE", "_LAZY")
                                                  for target in node.targets):
            for constant in ast.walk(node.value):
                if isinstance(constant, ast.Constant) and isinstance(constant.value, str) \
                        and constant.value.startswith("agenttune."):
                    add(constant.value, by_name=True)
    return found


def test_every_top_level_entry_is_in_a_layer():
    order = layers()
    outside = sorted(entry.name for entry in PACKAGE.iterdir()
                     if entry.name not in NOT_LAYERED and entry.name != "__pycache__"
                     and layer_of("agenttune." + entry.name.removesuffix(".py"), order) is None)
    assert outside == [], (f"{outside}: add each to a layer of [tool.importlinter] in pyproject.toml "
                           "(and to docs/architecture.md), or move it into the package of its family")


def test_no_import_climbs_to_a_higher_layer_by_name():
    """import-linter reads `import` statements; a module named in a string and imported at run time
    (importlib, load_reference, a lazy table) must go down the layers too."""
    order, known = layers(), modules()
    climbs = []
    for name, path in known.items():
        own = layer_of(name, order)
        for target, by_name in imports_of(name, path, known):
            other = layer_of(target, order)
            same_package = target.split(".")[:2] == name.split(".")[:2]
            if by_name and own is not None and other is not None and other < own and not same_package:
                climbs.append(f"{name} -> {target}")
    assert climbs == []


def test_the_module_graph_has_no_cycle():
    """Every import counts (static, function-local, by name); a package's __init__ importing its own
    modules is no cycle unless one of them imports it back."""
    known = modules()
    graph = {name: {target for target, _ in imports_of(name, path, known) if target != name}
             for name, path in known.items()}
    cycles = strongly_connected(graph)
    assert cycles == [], cycles


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


PATH = re.compile(r"`([\w./-]+(?:\.py|\.md|\.toml|/))`")


def test_the_architecture_doc_names_only_paths_that_exist():
    """Paths in backticks and in the tree are relative to src/agenttune unless they start at the
    repository root (src/, tests/, docs/, plugins/, examples/, bench/); a bare file name (`hf.py` in
    the row of `components/engines/`) must name a file somewhere in src/agenttune."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    named = set(PATH.findall(text))
    tree = text.split("## The folder tree", 1)[1].split("```")[1]
    parents: list[str] = []
    for line in tree.splitlines()[2:]:  # after "src/agenttune/"
        match = re.match(r"^([│ ]*)[├└]── (\S+)", line)
        if match:
            depth = len(match.group(1)) // 4
            parents = parents[:depth] + [match.group(2)]
            named.add("/".join(parents))
    missing = []
    basenames = {path.name for path in PACKAGE.rglob("*")}
    for path in sorted(named):
        if "/" not in path.rstrip("/"):  # a module named beside its package in the same sentence or cell
            if path.rstrip("/") not in basenames and not (ROOT / path).exists():
                missing.append(path)
            continue
        at_root = path.split("/")[0] in ("src", "tests", "docs", "plugins", "examples", "bench") or path in (
            "pyproject.toml", "README.md", "CHANGELOG.md")
        where = ROOT / path if at_root else PACKAGE / path
        if not where.exists() and not (ROOT / "docs" / path).exists():
            missing.append(path)
    assert missing == []
    assert len(named) > 40  # the doc names the house's rooms and their main modules
