"""The package's shape: imports point down the layers, the packages form a line, no cycles,
nothing too large.

The layers are the order a request's parts depend on each other (docs/architecture.md): a
module may import from a lower layer, or from its own group; never from a higher layer or a
sibling group of its own layer (the router and the worker know nothing of each other). Apart
from the layers, no package imports one that imports it back, even where each module points
down: two packages that lean on each other are one, or one of them holds a type the other owns.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator, Mapping
from pathlib import Path

from support.paths import ROOT

PACKAGE = ROOT / "workerpool"

LAYERS: list[dict[str, list[str]]] = [
    {"utilities": ["workerpool", "workerpool.errors", "workerpool.units", "workerpool.endpoints",
                   "workerpool.runtime", "workerpool.logs", "workerpool.security", "workerpool.atomic",
                   "workerpool.linux", "workerpool.extras"]},
    {"events": ["workerpool.events"]},
    {"config": ["workerpool.config"]},
    {"burnpack": ["workerpool.burnpack"]},
    {"protocol": ["workerpool.protocol"]},
    {"models": ["workerpool.models"]},
    {"codecs": ["workerpool.codecs"]},
    {"client": ["workerpool.client"], "control": ["workerpool.control"]},
    {"worker spec": ["workerpool.worker", "workerpool.worker.spec"]},
    {"weights": ["workerpool.weights"]},
    {"worker": ["workerpool.worker.main", "workerpool.worker.template", "workerpool.worker.child"],
     "router": ["workerpool.router"]},
    {"supervisor": ["workerpool.supervisor"]},
    {"ops": ["workerpool.ops"], "gateway": ["workerpool.gateway"]},
    {"pool": ["workerpool.pool"]},
    {"cli": ["workerpool.cli", "workerpool.command", "workerpool.__main__"],
     "testing": ["workerpool.testing"]},
]
"""The groups of each layer, lowest layer first, with the modules and packages they hold. A module
belongs to the group naming it or its closest package (``workerpool`` itself: only its
``__init__``). ``workerpool.worker`` as a package is its ``__init__`` file, which imports only
what its layer may."""

MAX_TOP_MODULES = 12
MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 450


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


def _group(module: str) -> tuple[int, str]:
    """The layer and group of ``module``."""
    best: tuple[int, str, str] | None = None  # layer, group, the member that matched
    for layer, groups in enumerate(LAYERS):
        for group, members in groups.items():
            for member in members:
                inside = module == member or (member != "workerpool" and module.startswith(member + "."))
                if inside and (best is None or len(member) > len(best[2])):
                    best = (layer, group, member)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best[0], best[1]


def _imports(module: str, path: Path, *, top_level_only: bool = False,
             type_checking: bool = False) -> Iterator[tuple[int, str]]:
    """(line, module) for each workerpool module ``module`` imports at run time (and under
    ``TYPE_CHECKING`` when ``type_checking``); ``top_level_only`` leaves out imports inside
    functions."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if not type_checking and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(child) for child in ast.walk(node)}
        if top_level_only and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            skipped |= {id(child) for child in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            if source.split(".")[0] != "workerpool":
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                is_module = (PACKAGE.parent / (submodule.replace(".", "/") + ".py")).exists() or \
                    (PACKAGE.parent / submodule.replace(".", "/") / "__init__.py").exists()
                yield node.lineno, submodule if is_module else source
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "workerpool":
                    yield node.lineno, alias.name


def test_imports_point_down_the_layers() -> None:
    wrong = []
    for module, path in _modules():
        layer, group = _group(module)
        for line, target in _imports(module, path):
            target_layer, target_group = _group(target)
            if target_layer > layer or (target_layer == layer and target_group != group):
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {module} ({group}, layer {layer}) "
                             f"imports {target} ({target_group}, layer {target_layer})")
    assert not wrong, "\n".join(wrong)


def _cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """A path through ``graph`` that comes back to where it started, if there is one."""
    done: set[str] = set()

    def visit(node: str, trail: list[str]) -> list[str] | None:
        if node in trail:
            return [*trail[trail.index(node):], node]
        if node in done:
            return None
        for target in sorted(graph.get(node, ())):
            if (found := visit(target, [*trail, node])) is not None:
                return found
        done.add(node)
        return None

    return next((found for node in sorted(graph) if (found := visit(node, [])) is not None), None)


def _package(module: str) -> str:
    """The package ``module`` belongs to: the subpackage of ``workerpool`` holding it, or a
    top-level module itself."""
    return ".".join(module.split(".")[:2])


def test_no_module_imports_itself_back_in_a_cycle() -> None:
    graph = {module: {target for _, target in _imports(module, path, top_level_only=True)
                      if target != module and not module.startswith(target + ".")}  # its package's __init__
             for module, path in _modules()}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_module_points_back_at_its_owner_even_for_types() -> None:
    """Every import counts here, those for types and those inside functions too: a cycle that
    hides under ``TYPE_CHECKING`` is a back-pointer all the same (two objects that reach into
    each other); a part takes a narrow view of its owner instead (a ``Protocol`` of what it
    uses, which its owner meets without either importing the other)."""
    graph = {module: {target for _, target in _imports(module, path, type_checking=True)
                      if target != module and not module.startswith(target + ".")}
             for module, path in _modules()}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle, types included: " + " -> ".join(cycle)


def test_the_packages_form_a_line() -> None:
    """Every import counts here, those inside functions too: a package that imports another
    only when called still depends on it."""
    graph: dict[str, set[str]] = {}
    where: dict[tuple[str, str], str] = {}
    for module, path in _modules():
        for line, target in _imports(module, path):
            edge = (_package(module), _package(target))
            if edge[0] != edge[1]:
                graph.setdefault(edge[0], set()).add(edge[1])
                where.setdefault(edge, f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}")
    cycle = _cycle(graph)
    assert cycle is None, "packages that import each other:\n" + "\n".join(
        where[edge] for edge in itertools.pairwise(cycle))


def test_the_package_keeps_its_shape() -> None:
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, top
    too_large = []
    for module, path in _modules():
        source = path.read_text()
        if (lines := len(source.splitlines())) > MAX_MODULE_LINES:
            too_large.append(f"{module}: {lines} lines")
        for node in ast.walk(ast.parse(source)):
            limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else \
                MAX_FUNCTION_LINES if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else None
            if limit is not None and (size := node.end_lineno - node.lineno + 1) > limit:
                too_large.append(f"{module}.{node.name}: {size} lines (at most {limit})")
    assert not too_large, "\n".join(too_large)
