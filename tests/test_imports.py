"""The package's import graph: every `import` and `from ... import` of an infcl_ds module, at
any depth (inside functions too), read with ast. No module takes part in an import cycle, and
the layering of docs/architecture.md holds: ops < parallel < losses < engine < training and the
entry points, each importing only its own layer and those below; data, config and checkpoint
import neither the engine nor anything above it. (Imports by name at run time, importlib's, are
not seen: cli.py dispatches its commands so.) No two modules share a last name but those kept on
purpose (KEPT_SAME_NAMES, each with its reason)."""
import ast
from pathlib import Path
from typing import Dict, List, Optional, Set

PACKAGE = Path(__file__).resolve().parents[1] / "infcl_ds"

# From the bottom up: a module imports only from its own layer and those below it.
LAYERS = [("infcl_ds.ops",), ("infcl_ds.parallel",), ("infcl_ds.losses",), ("infcl_ds.engine",),
          ("infcl_ds.training", "infcl_ds.train", "infcl_ds.eval", "infcl_ds.export", "infcl_ds.cli")]
ENGINE = LAYERS.index(("infcl_ds.engine",))
# Beside the layers: they import neither the engine nor anything above it.
BESIDE = ("infcl_ds.data", "infcl_ds.config", "infcl_ds.checkpoint")

# Modules that deliberately share a last name, each group with the reason a reader will not
# confuse them. Any other shared name fails, and so does an entry here once it is gone.
KEPT_SAME_NAMES = {
    # The planner package and the module that composes its plan: both are the planner, the
    # one thing the package calls plan (`infcl-ds plan`).
    "plan": frozenset({"infcl_ds.plan", "infcl_ds.plan.plan"}),
}


def module_names(root: Path) -> Dict[str, Path]:
    """Dotted name -> file of every module of the package at `root` (a package by its __init__)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def same_names(root: Path = PACKAGE) -> Dict[str, frozenset]:
    """Last name -> the dotted names of the package's modules that share it (a package by its
    folder's name, so a module `data/eval.py` shares `eval` with the package `eval/`)."""
    by_name: Dict[str, Set[str]] = {}
    for dotted in module_names(root):
        if "." in dotted:  # the package itself has no sibling to be confused with
            by_name.setdefault(dotted.rpartition(".")[2], set()).add(dotted)
    return {name: frozenset(found) for name, found in by_name.items() if len(found) > 1}


def imported(name: str, path: Path, modules: Dict[str, Path]) -> Set[str]:
    """The package's modules that `name` imports anywhere in its source: a `from X import y` is
    an edge to X.y where that is a module, else to X."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    root = name.split(".")[0]
    edges = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = alias.name
                while target and target not in modules:  # `import a.b.c`: the deepest module of it
                    target = target.rpartition(".")[0]
                edges.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != root:
                continue
            for alias in node.names:
                edges.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source)
    return {target for target in edges if target in modules and target != name}


def import_graph(root: Path = PACKAGE) -> Dict[str, Set[str]]:
    modules = module_names(root)
    return {name: imported(name, path, modules) for name, path in modules.items()}


def cyclic_parts(graph: Dict[str, Set[str]]) -> List[frozenset]:
    """The strongly connected parts of more than one module (Tarjan's algorithm)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    parts = []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = set()
            while not part or v not in part:
                part.add(stack.pop())
            if len(part) > 1:
                parts.append(frozenset(part))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return parts


def one_cycle(graph: Dict[str, Set[str]], part: frozenset) -> str:
    """A cycle through `part`'s first module, as "a -> b -> a": what a failure names."""
    start = min(part)
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth first inside the part, back to start
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & part):
                if w == start:
                    return " -> ".join(paths[v] + [start])
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{sorted(part)} is not cyclic")


def inside(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def layer(name: str) -> Optional[int]:
    return next((i for i, prefixes in enumerate(LAYERS) if inside(name, prefixes)), None)


def test_the_graph_sees_relative_nested_and_submodule_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .sub import b\nfrom pkg import a\n")
    (pkg / "a.py").write_text("import os\nimport pkg.sub.b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import x\n    from . import c\n")
    (pkg / "sub" / "c.py").write_text("from pkg.sub import nothing\n")
    graph = import_graph(pkg)
    assert graph == {"pkg": {"pkg.a", "pkg.sub.b"}, "pkg.a": {"pkg.sub.b"}, "pkg.sub": set(),
                     "pkg.sub.b": {"pkg.a", "pkg.sub.c"}, "pkg.sub.c": {"pkg.sub"}}
    assert cyclic_parts(graph) == [frozenset({"pkg.a", "pkg.sub.b"})]
    assert one_cycle(graph, cyclic_parts(graph)[0]) == "pkg.a -> pkg.sub.b -> pkg.a"


def test_no_import_cycle():
    graph = import_graph()
    cycles = [one_cycle(graph, part) for part in cyclic_parts(graph)]
    assert not cycles, "import cycles: " + "; ".join(cycles)


def test_no_layer_imports_a_higher_one():
    graph = import_graph()
    upward = [f"{a} -> {b}" for a in sorted(graph) for b in sorted(graph[a])
              if layer(a) is not None and layer(b) is not None and layer(b) > layer(a)]
    assert not upward, f"imports of a higher layer ({' < '.join(p[0] for p in LAYERS)}): {upward}"


def test_data_config_and_checkpoint_import_neither_the_engine_nor_the_entry_points():
    graph = import_graph()
    beside = [f"{a} -> {b}" for a in sorted(graph) if inside(a, BESIDE)
              for b in sorted(graph[a]) if (layer(b) or 0) >= ENGINE]
    assert not beside, f"{', '.join(BESIDE)} import the engine or above it: {beside}"


def test_same_names_sees_modules_and_packages(tmp_path):
    pkg = tmp_path / "pkg"
    for folder in ("a", "b", "eval"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    for module in ("__init__.py", "a/cli.py", "b/cli.py", "b/eval.py", "a/only.py"):
        (pkg / module).write_text("")
    assert same_names(pkg) == {"cli": frozenset({"pkg.a.cli", "pkg.b.cli"}),
                               "eval": frozenset({"pkg.eval", "pkg.b.eval"})}


def test_no_two_modules_share_a_name_but_the_kept_ones():
    shared = same_names()
    new = [f"{name}: {sorted(found)}" for name, found in sorted(shared.items()) if KEPT_SAME_NAMES.get(name) != found]
    assert not new, "modules sharing a name (name each for what it holds): " + "; ".join(new)
    gone = sorted(set(KEPT_SAME_NAMES) - set(shared))
    assert not gone, f"no longer shared: remove {gone} from KEPT_SAME_NAMES"
