"""The house rules the layout depends on, checked on the tree itself
(docs/ARCHITECTURE.md): no module imports another module's `_private`
name, none passes 500 lines, no import cycle (function-local imports
included), and the import-linter contracts in pyproject.toml cover every
module of the packages they keep apart."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("alineo_site", "sessions", "sandboxes")
#: Where the rules apply: the product, its benches and examples, and the tests.
TREES = (*PRODUCT, "bench", "examples", "tests")
MAX_LINES = 500


def _python_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                          "--", *(f"{t}/*.py" for t in TREES)],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / p for p in out if "/migrations/" not in p and (ROOT / p).is_file()]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _ours(module: str) -> bool:
    return module.split(".")[0] in TREES


def _is_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def private_imports(path: Path) -> list[str]:
    """`from x import _name` and, outside the tests (which may look inside a
    module they test), `module._name`, for modules of this repo."""
    module, tree = _module_name(path), ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    aliases: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _ours(a.name):
                    aliases.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node, is_package)
            if not _ours(source):
                continue
            for a in node.names:
                if _is_private(a.name) and not _is_module(f"{source}.{a.name}"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {source} import {a.name}")
                elif _is_module(f"{source}.{a.name}"):
                    aliases.add(a.asname or a.name)
    white_box = module.split(".")[0] == "tests"
    for node in ast.walk(tree):
        if (not white_box and isinstance(node, ast.Attribute) and _is_private(node.attr)
                and isinstance(node.value, ast.Name) and node.value.id in aliases):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_module_imports_another_modules_private_name():
    found = [hit for path in _python_files() for hit in private_imports(path)]
    assert not found, "private names used across modules:\n" + "\n".join(found)


def test_no_module_passes_500_lines():
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in _python_files()
            if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, "split these modules:\n" + "\n".join(long)


def _cycles(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for start in sorted(modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start) & modules)))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(
                        graph.find_modules_directly_imported_by(child) & modules))))
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
                    out.append(sorted(component))
    return out


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    # grimp counts every import statement: function-local ones and those under
    # TYPE_CHECKING too, so a cycle cannot hide behind either.
    return grimp.build_graph(*PRODUCT, include_external_packages=True)


def test_no_import_cycle_between_any_two_modules(graph):
    ours = {m for m in graph.modules if m.split(".")[0] in PRODUCT}
    assert _cycles(graph, ours) == []


def test_the_cycle_check_finds_a_cycle():
    graph = grimp.ImportGraph()
    for m in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(m)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.c")
    graph.add_import(importer="p.c", imported="p.a")
    assert _cycles(graph, {"p.a", "p.b", "p.c"}) == [["p.a", "p.b", "p.c"]]


def _contract(name: str) -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return next(c for c in config["contracts"] if c["name"] == name)


@pytest.mark.parametrize("name, package, allowed", [
    ("The bridge imports nothing outside itself", "sandboxes.bridge", ()),
    ("The client imports nothing outside itself", "sessions.client", ()),
])
def test_a_self_contained_package_is_forbidden_every_sibling(graph, name, package, allowed):
    """A forbidden contract lists modules by name: a module added beside the
    package must be added to it, or the contract would let it through."""
    contract = _contract(name)
    assert contract["source_modules"] == [package]
    parent = package.rpartition(".")[0]
    siblings = {m for m in graph.find_children(parent) if m != package}
    others = set(PRODUCT) - {parent}
    externals = {m for m in graph.modules if "." not in m and m not in PRODUCT
                 and m not in sys.stdlib_module_names}
    missing = (siblings | others | externals) - set(contract["forbidden_modules"])
    assert not missing, f"add to the contract {name!r}: {sorted(missing)}"


def test_the_bridge_is_reached_only_through_its_protocol(graph):
    """The host shares two modules with the in-sandbox program: its protocol,
    and the demo model's directives (the model gateway's demo upstream)."""
    bridge = {m for m in graph.modules if m.startswith("sandboxes.bridge.")} | {"sandboxes.bridge"}
    outside = {m for m in graph.modules if m.split(".")[0] in PRODUCT} - bridge
    reached = {imported for m in outside for imported in graph.find_modules_directly_imported_by(m)
               if imported in bridge}
    assert reached <= {"sandboxes.bridge.protocol", "sandboxes.bridge.directives"}, sorted(reached)


def test_lint_imports_keeps_every_contract():
    linter = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(linter), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
