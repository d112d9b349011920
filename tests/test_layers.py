"""The package's shape holds: imports point one way, and no module or class grows past what a
reader takes in at once. Read from the source (ast), so nothing is imported or run.

Layers, each importing only those before it: core <- config <- runtime <- wire <- weights <-
delivery (weights also reads models: which tensors a LoRA adapter publishes);
the maths (algos) imports core alone (no config, no torch-free vocabulary's users); and the
packages as a whole import each other without a circle.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

GRPO = Path(__file__).resolve().parent.parent / "grpo"

# What each lower package may import (itself included); the roles and tools above them may
# import anything below that does not close a circle.
ALLOWED = {
    "core": {"core"},
    "config": {"core", "config"},
    "runtime": {"core", "config", "runtime"},
    "wire": {"core", "config", "runtime", "wire"},
    "weights": {"core", "config", "runtime", "wire", "models", "weights"},
    "delivery": {"core", "config", "runtime", "wire", "weights", "delivery"},
    "algos": {"core", "algos"},
}
# A smoke alarm, not a shape: a module past it is doing several jobs. Classes have no cap (a
# 200-line one had classes squeezed under it by folding docstrings, issue 60).
MAX_MODULE_LINES = 600


def _unit(dotted: str) -> str:
    """grpo.wire.codec -> wire; grpo.plan -> plan."""
    return dotted.split(".")[1]


def _modules() -> dict[Path, ast.Module]:
    return {f: ast.parse(f.read_text(), str(f)) for f in sorted(GRPO.rglob("*.py"))}


def _imports(tree: ast.Module) -> set[str]:
    """Every grpo module a file imports, at its top, in a function or under TYPE_CHECKING."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.startswith("grpo.")}


def _package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for path, tree in _modules().items():
        rel = path.relative_to(GRPO.parent).with_suffix("")
        if len(rel.parts) < 2 or rel.parts[1] in ("__init__", "__main__"):
            continue
        me = rel.parts[1]
        graph[me] |= {_unit(m) for m in _imports(tree)} - {me}
    return graph


@pytest.mark.parametrize("package", list(ALLOWED))
def test_a_lower_layer_imports_nothing_above_it(package):
    above = _package_graph()[package] - ALLOWED[package]
    assert not above, f"grpo/{package}/ imports {sorted(above)}, above its layer"


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """A circle of `graph`'s arrows (its nodes in order, the first repeated last), or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return None
        for nxt in sorted(graph.get(node, ())):
            if (found := visit(nxt, path + [node])) is not None:
                return found
        done.add(node)
        return None

    return next((c for node in sorted(graph) if (c := visit(node, [])) is not None), None)


# A weights mode's own machinery, which the delivery and the wire carry without reading
# (issue 60.3): their announcements are opaque bodies that only the mode parses.
MODE_INTERNALS = ("grpo.weights.stream", "grpo.weights.collective")


@pytest.mark.parametrize("package", ["delivery", "wire"])
def test_the_delivery_and_the_wire_know_no_weights_mode(package):
    found = {
        f"{path.relative_to(GRPO.parent)} imports {m}"
        for path, tree in _modules().items()
        if path.relative_to(GRPO).parts[0] == package
        for m in _imports(tree)
        if m.startswith(MODE_INTERNALS)
    }
    assert not found, sorted(found)


def test_the_packages_import_each_other_without_a_circle():
    circle = _circle(_package_graph())
    assert circle is None, "import circle: " + " -> ".join(circle or [])


def _module_name(path: Path) -> str:
    rel = path.relative_to(GRPO.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.parts[-1] == "__init__" else rel.parts
    return ".".join(parts)


def _module_graph() -> dict[str, set[str]]:
    """Module -> the grpo modules it imports anywhere (at its top, in a function, under
    TYPE_CHECKING), relative imports resolved; `from pkg import name` counts as pkg.name when
    that is a module, else as pkg."""
    modules = _modules()
    names = {_module_name(p) for p in modules}
    graph: dict[str, set[str]] = {}
    for path, tree in modules.items():
        me = _module_name(path)
        package = me if path.name == "__init__.py" else me.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")
                if node.level:
                    base = base[: len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    child = f"{target}.{alias.name}"
                    found.add(child if child in names else target)
        graph[me] = {m for m in found if m in names and m != me}
    return graph


def test_no_module_imports_one_that_imports_it_back():
    """Issue 44: no circle of modules, whatever the kind of import (a function-level import or
    one under TYPE_CHECKING is still a circle a reader must untangle)."""
    circle = _circle(_module_graph())
    assert circle is None, "module circle: " + " -> ".join(circle or [])


def test_no_module_is_too_long_to_read():
    too_long = []
    for path in _modules():
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{path.relative_to(GRPO.parent)}: {lines} lines")
    assert not too_long, "over the limits: " + "; ".join(too_long)


# What a training step runs below the loop (grpo.trainer.loop): each stage reads the part of
# the run plan it needs (grpo.plan), never the whole Config.
STEP_MODULES = ("step", "experience", "scoring", "ranks")


def test_no_function_of_a_step_takes_the_config():
    """Issue 44: a stage of the step says what it reads (a plan's fields), so that a reader of
    train_step does not chase the Config through every function below it."""
    taking = []
    for stage in STEP_MODULES:
        path = GRPO / "trainer" / f"{stage}.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
                if any(a.annotation is not None and ast.unparse(a.annotation) == "Config"
                       for a in args):  # fmt: skip
                    taking.append(f"trainer/{stage}.py:{node.name}")
    assert not taking, "takes the Config: " + ", ".join(taking)
