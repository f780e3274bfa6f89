"""One name per idea: no public class name is defined in two modules of the harnessrl package.

Two classes of one name in two modules make a reader (and an import) guess which one is meant.
The classes are read from the source with `ast` (nothing is imported): every class defined at
module scope, including under a module-level `if`, `try` or `with`; a class inside a function or
another class is not module-level and does not count. Names starting with an underscore are
private to their module and do not count either.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "src" / "harnessrl"


def _module_scope(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements of a module body, those under module-level if / try / with included."""
    found = []
    for node in body:
        found.append(node)
        if isinstance(node, ast.If):
            found += _module_scope(node.body) + _module_scope(node.orelse)
        elif isinstance(node, ast.Try):
            for handler in node.handlers:
                found += _module_scope(handler.body)
            found += _module_scope(node.body) + _module_scope(node.orelse) + _module_scope(node.finalbody)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            found += _module_scope(node.body)
    return found


def public_classes(package_dir: Path) -> dict[str, list[str]]:
    """{public class name: ["path/in/package.py:line", ...]} for every module-level class."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(package_dir.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        where = path.relative_to(package_dir.parent).as_posix()
        for node in _module_scope(tree.body):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                found[node.name].append(f"{where}:{node.lineno}")
    return dict(found)


def defined_twice(package_dir: Path) -> dict[str, list[str]]:
    """The public class names defined in more than one module, with where each is."""
    twice = {}
    for name, places in public_classes(package_dir).items():
        if len({p.rsplit(":", 1)[0] for p in places}) > 1:
            twice[name] = places
    return dict(sorted(twice.items()))


def test_no_public_class_name_is_defined_in_two_modules():
    found = defined_twice(PACKAGE_DIR)
    assert not found, "public class names defined in more than one module (give each idea its own name):\n" + (
        "\n".join(f"  {name}: {', '.join(places)}" for name, places in found.items())
    )


def test_reader_counts_module_level_public_classes_only(tmp_path):
    pkg = tmp_path / "harnessrl"
    files = {
        "__init__.py": "",
        "a.py": "class Job:\n    class Inner:\n        pass\nclass _Hidden:\n    pass\n",
        "b.py": "import sys\nif sys.version_info >= (3, 11):\n    class Job:\n        pass\nclass _Hidden:\n    pass\n",
        "sub/__init__.py": "",
        "sub/c.py": (
            "def f():\n    class Job:\n        pass\n"
            "try:\n    class Inner:\n        pass\nexcept ImportError:\n    pass\n"
        ),
        "sub/d.py": "class Once:\n    pass\n",
    }
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text, encoding="utf-8")
    assert public_classes(pkg) == {
        "Job": ["harnessrl/a.py:1", "harnessrl/b.py:3"],
        "Inner": ["harnessrl/sub/c.py:5"],
        "Once": ["harnessrl/sub/d.py:1"],
    }
    assert defined_twice(pkg) == {"Job": ["harnessrl/a.py:1", "harnessrl/b.py:3"]}


MAX_MODULE_LINES = 800  # README.md, "Layout": a module past this is split along its ideas


def long_modules(package_dir: Path, limit: int = MAX_MODULE_LINES) -> dict[str, int]:
    """{path in the package: line count} of the modules longer than `limit` lines."""
    found = {}
    for path in sorted(package_dir.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            found[path.relative_to(package_dir.parent).as_posix()] = lines
    return found


def test_long_modules_are_found(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "short.py").write_text("x = 1\n" * 10)
    (package / "long.py").write_text("x = 1\n" * 11)
    assert long_modules(package, limit=10) == {"pkg/long.py": 11}


def test_no_module_is_longer_than_the_limit():
    found = long_modules(PACKAGE_DIR)
    assert not found, f"modules over {MAX_MODULE_LINES} lines (split each along its ideas): {found}"
