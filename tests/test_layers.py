"""The layers of docs/architecture.md, read from the source: no import circle (lazy and type-only imports too), each
layer imports only the layers below it (toolkit → data order → loading → engine → trainer → commands), and the
runtime's root holds few modules."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("nanoset", "runtime")
# the commands, and what a worker whose peer died leaves for the launcher to report
COMMANDS = ("runtime.cli", "runtime.train", "runtime.evaluate", "runtime.explain", "runtime.export",
            "runtime.broken_collective")

# a layer's modules → the prefixes they may import (their own layer included); the lowest layer first
LAYERS = {
    "nanoset": ("nanoset",),
    # the config owns its parsers (Hugging Face's config.json included) and asks the torch-free registry of model
    # families what a family takes
    "runtime.config": ("nanoset", "runtime.config", "runtime.models.registry", "runtime.models.spec"),
    "runtime.data.order": ("nanoset", "runtime.config", "runtime.data.order"),
    "runtime.parallel": ("nanoset", "runtime.config", "runtime.parallel"),
    "runtime.models": ("nanoset", "runtime.config", "runtime.parallel", "runtime.models"),
    "runtime.data.loading": ("nanoset", "runtime.config", "runtime.data.order", "runtime.data.loading",
                             "runtime.parallel", "runtime.control.preemption"),
    "runtime.engine": ("nanoset", "runtime.config", "runtime.data.loading", "runtime.models", "runtime.parallel",
                       "runtime.sample_losses"),
}
# the imports that cross upwards: `nanoset train`, a toolkit command, starts the runtime's launcher, and
# `nanoset metrics` reads a run's metrics.jsonl with the runtime's torch-free summary and plot
COMMAND_BRIDGE = {"nanoset.cli": {"runtime", "runtime.cli", "runtime.cli.launch", "runtime.control",
                                  "runtime.control.preemption", "runtime.observe", "runtime.observe.metrics_summary",
                                  "runtime.observe.metrics_plot"}}


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


MODULES = {module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def imported(path: Path) -> set[str]:
    """The project modules ``path`` imports anywhere in it: at module level, inside functions (lazy) and under
    ``if TYPE_CHECKING:`` (type-only)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    with_packages = set(names)
    for name in names:  # importing a.b.c runs a and a.b first
        parts = name.split(".")
        with_packages |= {".".join(parts[:i]) for i in range(1, len(parts))}
    return {name for name in with_packages if name in MODULES}


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_no_module_imports_itself_through_a_circle():
    """The import graph of both packages, every import counted (lazy and type-only ones too), has no cycle; a
    module's own packages do not count (they are running when it is imported)."""
    graph = {name: {m for m in imported(path) if m != name and not within(name, m)}
             for name, path in MODULES.items()}
    state: dict[str, str] = {}
    circles: list[list[str]] = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for other in sorted(graph[name]):
            if state.get(other) == "open":
                circles.append(path[path.index(other):] + [other])
            elif other not in state:
                visit(other, path + [other])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert len(MODULES) > 100  # both packages were read
    assert circles == []


def test_each_layer_imports_only_the_layers_below_it():
    """Every import, lazy ones too: the toolkit never reaches the runtime (but ``nanoset train``'s bridge), the data
    order is config and numpy, loading never reaches the engine, the engine never the trainer, and no module below
    the commands imports one."""
    wrong = []
    for name, path in MODULES.items():
        uses = imported(path) - COMMAND_BRIDGE.get(name, set())
        layer = max((prefix for prefix in LAYERS if within(name, prefix)), key=len, default=None)
        if layer is not None:
            wrong += [(name, m) for m in sorted(uses) if not any(within(m, ok) for ok in LAYERS[layer])
                      and not any(within(ok, m) for ok in LAYERS[layer])]  # a package __init__ above an allowed one
        if not any(within(name, command) for command in COMMANDS):
            wrong += [(name, m) for m in sorted(uses) if any(within(m, command) for command in COMMANDS)]
    assert wrong == []


def defines_something(path: Path) -> bool:
    """Whether a module holds more than a docstring, imports and an ``if __name__ == "__main__":`` entry (a thin
    entry point or re-export of a name that lives elsewhere)."""
    for statement in ast.parse(path.read_text()).body:
        if isinstance(statement, (ast.Import, ast.ImportFrom)) or (
                isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)):
            continue
        if isinstance(statement, ast.If) and "__main__" in ast.unparse(statement.test):
            continue
        if isinstance(statement, ast.Assign) and [getattr(t, "id", None) for t in statement.targets] == ["__all__"]:
            continue
        return True
    return False


def test_the_runtime_root_holds_at_most_ten_modules_that_define_something():
    """The rest is grouped by concept into folders (observe/, control/, checkpoint/, …)."""
    defining = sorted(p.name for p in (ROOT / "runtime").glob("*.py") if p.name != "__init__.py"
                      and defines_something(p))
    assert "trainer.py" in defining and not defines_something(ROOT / "runtime" / "evaluate.py")
    assert len(defining) <= 10, defining


OBJECT_STORAGE = {"fsspec", "s3fs", "gcsfs", "obstore", "boto3", "botocore", "aiobotocore"}


def test_object_storage_libraries_are_imported_by_the_storage_seam_only_and_lazily():
    """``nanoset/storage.py`` alone reaches an object store, importing its library at the first URL: the toolkit
    and the runtime import and train without any of them."""
    def storage_imports(path: Path, module_level: bool) -> set[str]:
        tree = ast.parse(path.read_text())
        nodes = tree.body if module_level else list(ast.walk(tree))
        names = {a.name for n in nodes if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in nodes if isinstance(n, ast.ImportFrom) and n.module}
        return {name.split(".")[0] for name in names} & OBJECT_STORAGE

    anywhere = {name for name, path in MODULES.items() if storage_imports(path, module_level=False)}
    assert anywhere == {"nanoset.storage"}
    assert storage_imports(MODULES["nanoset.storage"], module_level=True) == set()
