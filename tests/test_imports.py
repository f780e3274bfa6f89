"""No import cycle inside the harnessrl package, and the layering rule between its layers.

The graph is read from the source with `ast` (nothing is imported): one node per module, one edge
per import of another harnessrl module. Every import counts, wherever it stands: at module level,
inside a function, or under `if TYPE_CHECKING:`. A deferred or type-only import still makes the
two modules depend on each other; it only hides the cycle from the interpreter. Imports whose
module name is computed at run time (`importlib.import_module`) are not seen.

Edges: `import a.b` and `from a.b import name` point at a.b; `from a import b` points at the
submodule a.b when there is one (else at a's __init__); relative imports are resolved against
the importing module. The parent packages an import initialises on the way are not edges: every
submodule has them, and they are no design dependency.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import harnessrl

PACKAGE_DIR = Path(harnessrl.__file__).parent
PACKAGE = PACKAGE_DIR.name

# The layering rules: modules under these packages import nothing from the packages named (any
# import, deferred or type-only included). Models are a door to a model: they know nothing of the
# harnesses that prompt them or the tasks those harnesses run. Harnesses know nothing of
# `harnessrl serve`: the HTTP formats both answer with (chat completions, Responses, Messages) are
# the wire package below them, which knows neither. Trainers and the evolution know nothing of
# the jobs: jobs (eval, study, improve) are the entries above them and call them, and what both
# share, the evaluation folder (eval_folder.py), lives below both.
FORBIDDEN_IMPORTS: dict[str, tuple[str, ...]] = {
    f"{PACKAGE}.models": (f"{PACKAGE}.harness", f"{PACKAGE}.tasks"),
    f"{PACKAGE}.harness": (f"{PACKAGE}.serve",),
    f"{PACKAGE}.wire": (f"{PACKAGE}.serve", f"{PACKAGE}.harness"),
    f"{PACKAGE}.train": (f"{PACKAGE}.jobs",),
    f"{PACKAGE}.evolve": (f"{PACKAGE}.jobs",),
}

# Private names (`_name`) one module imports from another, tolerated for now (none left), each with why it
# is still private. Every other helper a second module needs is public (no underscore, with a
# docstring). An entry must still match an import (the test fails on one that no longer does),
# so this list can only shrink.
KNOWN_PRIVATE_IMPORTS: dict[tuple[str, str, str], str] = {}

# Cycles tolerated for now: none. An entry would have to name a real cycle (the test fails on an
# entry that no longer matches one), so this list can only shrink.
KNOWN_CYCLES: list[frozenset[str]] = []


@dataclass(frozen=True)
class Edge:
    target: str
    where: str  # "path/in/package.py:line"
    import_time: bool  # at module level and not under TYPE_CHECKING: runs when the module is imported


def module_names(package_dir: Path) -> dict[str, Path]:
    """{dotted module name: file} for every .py file of the package (a package is its __init__)."""
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = [package_dir.name, *path.relative_to(package_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement with whether it runs at import time."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, import_time: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append((node, import_time))
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            import_time = False
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, False)
            for child in node.orelse:
                visit(child, import_time)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, import_time)

    visit(tree, True)
    return found


def import_graph(package_dir: Path) -> dict[str, list[Edge]]:
    """{module: its edges to other modules of the package}."""
    modules = module_names(package_dir)
    graph: dict[str, list[Edge]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        where = path.relative_to(package_dir.parent).as_posix()
        edges = []
        for node, import_time in _imports(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                source = _source_module(node, name, is_package)  # relative: level 1 is the own package
                # `from a import b`: the submodule a.b when there is one, else a name defined in a
                targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]
            for target in dict.fromkeys(targets):
                while target and target not in modules:  # outside the package ("os.path"): dropped
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.append(Edge(target, f"{where}:{node.lineno}", import_time))
        graph[name] = edges
    return graph


def _source_module(node: ast.ImportFrom, name: str, is_package: bool) -> str:
    """The module a `from ... import` reads from, relative imports resolved against `name`."""
    if not node.level:
        return node.module or ""
    base = name.split(".") if is_package else name.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


@dataclass(frozen=True)
class PrivateImport:
    importer: str
    source: str
    name: str
    where: str  # "path/in/package.py:line"

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.importer, self.source, self.name)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(package_dir: Path) -> list[PrivateImport]:
    """Every `from M import _name` (and `import M._name`) of one package module from another,
    and every `M._name` read through an imported module M, wherever it stands (deferred and
    type-only imports included); dunder names are not private."""
    modules = module_names(package_dir)
    root = package_dir.name
    found = []
    for name, path in modules.items():
        where = path.relative_to(package_dir.parent).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        bound: dict[str, str] = {}  # local name -> the package module it is bound to
        for node, _ in _imports(tree):
            if isinstance(node, ast.ImportFrom):
                source = _source_module(node, name, path.name == "__init__.py")
                pairs = [(source, alias.name) for alias in node.names]
                bound.update((a.asname or a.name, f"{source}.{a.name}") for a in node.names)
            else:
                pairs = [tuple(alias.name.rsplit(".", 1)) for alias in node.names if "." in alias.name]
                for alias in node.names:  # `import a.b` binds a; `import a.b as c` binds c to a.b
                    local = alias.asname or alias.name.split(".")[0]
                    bound[local] = alias.name if alias.asname else local
            for source, imported in pairs:
                if (source == root or source.startswith(root + ".")) and source != name and _is_private(imported):
                    found.append(PrivateImport(name, source, imported, f"{where}:{node.lineno}"))
        for node in ast.walk(tree):  # module._name
            if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
                continue
            chain, value = [], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in bound:
                source = ".".join([bound[value.id], *reversed(chain)])
                if source in modules and source != name:
                    found.append(PrivateImport(name, source, node.attr, f"{where}:{node.lineno}"))
    return found


def cycles(graph: dict[str, list[Edge]], import_time_only: bool = False) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (each holds a cycle)."""
    succ = {m: {e.target for e in edges if e.import_time or not import_time_only} for m, edges in graph.items()}

    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in succ[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reach = {m: reachable(m) for m in succ}
    components = {frozenset({m} | {o for o in reach[m] if m in reach[o]}) for m in succ}
    return sorted((c for c in components if len(c) > 1), key=sorted)


def describe(component: frozenset[str], graph: dict[str, list[Edge]]) -> str:
    """'a -> b (a.py:3) -> a (b.py:7)': the shortest cycle through the component's first module."""
    start = min(component)
    paths: dict[str, list[tuple[str, str]]] = {start: []}
    todo = [start]
    while todo:
        here = todo.pop(0)
        for e in graph[here]:
            if e.target == start:
                steps = paths[here] + [(e.target, e.where)]
                return f"{start} " + " ".join(f"-> {m} ({w})" for m, w in steps)
            if e.target in component and e.target not in paths:
                paths[e.target] = paths[here] + [(e.target, e.where)]
                todo.append(e.target)
    raise AssertionError(f"no cycle through {start}")  # unreachable for a component of cycles()


def test_no_import_cycle_in_the_package():
    graph = import_graph(PACKAGE_DIR)
    found = cycles(graph)
    new = [c for c in found if c not in KNOWN_CYCLES]
    assert not new, "import cycles (modules, then one cycle with the import lines):\n" + "\n".join(
        f"  {sorted(c)}\n    {describe(c, graph)}" for c in new
    )
    gone = [sorted(c) for c in KNOWN_CYCLES if c not in found]
    assert not gone, f"KNOWN_CYCLES lists cycles that no longer exist; remove them: {gone}"


def test_no_cycle_among_imports_that_run_at_import_time():
    """Module-level imports in a cycle make importing fail or succeed by import order: never allowed."""
    graph = import_graph(PACKAGE_DIR)
    found = cycles(graph, import_time_only=True)
    assert not found, "\n".join(f"{sorted(c)}: {describe(c, graph)}" for c in found)


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def layering_violations(graph: dict[str, list[Edge]], rules: dict[str, tuple[str, ...]]) -> list[str]:
    """'importer -> imported (path:line)' for every import a layering rule forbids."""
    found = []
    for module, edges in sorted(graph.items()):
        for layer, forbidden in rules.items():
            if not _inside(module, layer):
                continue
            for e in edges:
                if any(_inside(e.target, f) for f in forbidden):
                    found.append(f"{module} -> {e.target} ({e.where})")
    return found


def test_no_import_the_layering_rules_forbid():
    found = layering_violations(import_graph(PACKAGE_DIR), FORBIDDEN_IMPORTS)
    assert not found, "imports the layering rule forbids:\n" + "\n".join(f"  {v}" for v in found)


def test_no_module_imports_a_private_name_of_another():
    found = private_imports(PACKAGE_DIR)
    new = [
        f"  {p.importer} imports {p.name} from {p.source} ({p.where})"
        for p in found
        if p.key not in KNOWN_PRIVATE_IMPORTS
    ]
    assert not new, (
        "private names imported from another module (make the helper public: drop the underscore and "
        "give it a docstring):\n" + "\n".join(new)
    )
    gone = sorted(set(KNOWN_PRIVATE_IMPORTS) - {p.key for p in found})
    assert not gone, f"KNOWN_PRIVATE_IMPORTS lists imports that no longer exist; remove them: {gone}"


def test_every_tolerated_private_import_says_why():
    assert all(reason.strip() for reason in KNOWN_PRIVATE_IMPORTS.values())


# ------------------------------------------------------------------------------------------------
# The graph reader itself, on a small package written for the test.


def write_package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / PACKAGE / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / PACKAGE


def test_reader_sees_deferred_type_only_and_relative_imports(tmp_path):
    pkg = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "def f():\n    from harnessrl.b import g\n",
            "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n",
            "sub/__init__.py": "from . import c\n",
            "sub/c.py": "from .. import d\n",
            "d.py": "import harnessrl.sub.c as c\n",
            "e.py": "import os\nfrom harnessrl import a, b\nfrom harnessrl.sub import c\n",
        },
    )
    graph = import_graph(pkg)
    assert {e.target for e in graph["harnessrl.e"]} == {"harnessrl.a", "harnessrl.b", "harnessrl.sub.c"}
    assert [(e.target, e.import_time) for e in graph["harnessrl.a"]] == [("harnessrl.b", False)]
    assert [(e.target, e.import_time) for e in graph["harnessrl.b"]] == [("harnessrl.a", False)]
    assert [e.target for e in graph["harnessrl.sub"]] == ["harnessrl.sub.c"]
    assert [e.target for e in graph["harnessrl.sub.c"]] == ["harnessrl.d"]
    found = cycles(graph)
    assert found == [frozenset({"harnessrl.a", "harnessrl.b"}), frozenset({"harnessrl.d", "harnessrl.sub.c"})]
    assert cycles(graph, import_time_only=True) == [frozenset({"harnessrl.d", "harnessrl.sub.c"})]
    cycle = "harnessrl.a -> harnessrl.b (harnessrl/a.py:2) -> harnessrl.a (harnessrl/b.py:3)"
    assert describe(found[0], graph) == cycle


def test_reader_resolves_names_and_leaves_out_other_packages(tmp_path):
    pkg = write_package(
        tmp_path,
        {
            "__init__.py": "from harnessrl.x import VALUE\n",
            "x.py": "import json\nimport harnessrl\nfrom harnessrl import __version__\nVALUE = 1\n",
            "y.py": "import os.path\nimport harnessrl.x\nfrom harnessrl.x import *\n",
        },
    )
    graph = import_graph(pkg)
    assert [e.target for e in graph["harnessrl.y"]] == ["harnessrl.x", "harnessrl.x"]
    assert {e.target for e in graph["harnessrl.x"]} == {"harnessrl"}
    assert cycles(graph) == [frozenset({"harnessrl", "harnessrl.x"})]


def test_layering_rule_sees_every_kind_of_forbidden_import(tmp_path):
    pkg = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "types.py": "",
            "harness/__init__.py": "",
            "harness/protocols.py": "",
            "tasks/__init__.py": "",
            "tasks/base.py": "",
            "models/__init__.py": "from harnessrl.types import *\n",
            "models/plain.py": "from harnessrl.harness.protocols import x\n",
            "models/deferred.py": "def f():\n    import harnessrl.tasks.base\n",
            "models/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..tasks import base\n",
            "models/sub/__init__.py": "from harnessrl import harness\n",
            "harness/loops.py": "from harnessrl.models import plain\n",  # the other direction is allowed
            "serve/__init__.py": "",
            "serve/app.py": "from harnessrl.harness import loops\n",  # allowed: serve builds on harness
            "harness/external.py": "def f():\n    from harnessrl.serve import app\n",
        },
    )
    found = layering_violations(import_graph(pkg), FORBIDDEN_IMPORTS)
    assert found == [
        "harnessrl.harness.external -> harnessrl.serve.app (harnessrl/harness/external.py:2)",
        "harnessrl.models.deferred -> harnessrl.tasks.base (harnessrl/models/deferred.py:2)",
        "harnessrl.models.plain -> harnessrl.harness.protocols (harnessrl/models/plain.py:1)",
        "harnessrl.models.sub -> harnessrl.harness (harnessrl/models/sub/__init__.py:1)",
        "harnessrl.models.typed -> harnessrl.tasks.base (harnessrl/models/typed.py:3)",
    ]


def test_private_import_reader_sees_every_form_and_spares_dunders_and_other_packages(tmp_path):
    pkg = write_package(
        tmp_path,
        {
            "__init__.py": "from harnessrl.a import __version__\n",
            "a.py": "__version__ = '1'\n_HIDDEN = 1\n",
            "b.py": "from harnessrl.a import _HIDDEN, public\nfrom os import _exit\nfrom ._private import thing\n",
            "_private.py": "thing = 1\n",
            "sub/__init__.py": "",
            "sub/c.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .. import _private\n"
                "def f():\n    from ..a import _HIDDEN as h\n    import harnessrl._private\n"
            ),
            "d.py": (
                "import harnessrl.a\nimport harnessrl.sub as s\nfrom harnessrl import a\n"
                "x = harnessrl.a._HIDDEN, a._HIDDEN, s.c._f, a.__doc__, a.public, a\n"
                "class K:\n    _own = 1\n    y = a._HIDDEN if 0 else None\n"
            ),
        },
    )
    found = {(p.importer, p.source, p.name, p.where) for p in private_imports(pkg)}
    assert found == {
        ("harnessrl.b", "harnessrl.a", "_HIDDEN", "harnessrl/b.py:1"),
        ("harnessrl.sub.c", "harnessrl", "_private", "harnessrl/sub/c.py:3"),
        ("harnessrl.sub.c", "harnessrl.a", "_HIDDEN", "harnessrl/sub/c.py:5"),
        ("harnessrl.sub.c", "harnessrl", "_private", "harnessrl/sub/c.py:6"),
        ("harnessrl.d", "harnessrl.a", "_HIDDEN", "harnessrl/d.py:4"),
        ("harnessrl.d", "harnessrl.sub.c", "_f", "harnessrl/d.py:4"),
        ("harnessrl.d", "harnessrl.a", "_HIDDEN", "harnessrl/d.py:7"),
    }
