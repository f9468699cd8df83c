"""The architecture, executable: the policy layer never sees tensors, and no module imports a
module that imports it back.

Each check runs in a fresh interpreter, so what another test imported does not count.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import minivtc

PACKAGE = Path(__file__).resolve().parent.parent / "minivtc"

TORCH_FREE = [  # the scheduler sees requests, counters and a memory budget, never tensors
    "minivtc",
    "minivtc.fairness.scheduler",
    "minivtc.fairness.vtc",
    "minivtc.fairness.policies",
    "minivtc.fairness.predictors",
    "minivtc.fairness.cost",
    "minivtc.requests.params",
    "minivtc.requests.request",
    "minivtc.engine.admission",
    "minivtc.engine.engine",
    "minivtc.sim.simulator",
    "minivtc.sim.step_time",
    "minivtc.sim.workloads",
    "minivtc.sim.metrics",
    "minivtc.cli.main",
]


def modules_loaded_by(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys; print(*sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(out.stdout.split())


@pytest.mark.parametrize("module", TORCH_FREE)
def test_the_policy_layer_does_not_import_torch(module):
    assert "torch" not in modules_loaded_by(f"import {module}"), f"{module} imports torch"


def test_minivtc_help_does_not_import_torch():
    """`minivtc --help` and every subcommand's --help build their parsers without torch."""
    code = """
import contextlib, io
from minivtc.cli.main import main
for argv in (["--help"], *([c, "--help"] for c in ("simulate", "serve", "reproduce",
             "calibrate", "loadgen", "generate", "demo", "bench"))):
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            main(argv)
        except SystemExit:
            pass
"""
    assert "torch" not in modules_loaded_by(code)


def imports_in(tree: ast.Module, inside_functions: bool) -> list[ast.stmt]:
    """The import statements of a module: at module level, or also inside functions and
    classes; never those under `if TYPE_CHECKING:` (they run only for a type checker)."""
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            continue
        elif inside_functions or not isinstance(node, ast.FunctionDef | ast.ClassDef):
            if inside_functions or isinstance(node, ast.If | ast.Try | ast.With):
                todo.extend(ast.iter_child_nodes(node))
    return found


def package_imports(inside_functions: bool = False) -> dict[str, set[str]]:
    """module -> the package modules it imports (at module level, or anywhere with
    `inside_functions`; never under TYPE_CHECKING), read from the source."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        name = name.removesuffix(".__init__")
        deps = set()
        for node in imports_in(ast.parse(path.read_text()), inside_functions):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps.add(node.module)
                deps.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[name] = {d for d in deps if d.startswith("minivtc.")}
    return {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}


@pytest.mark.parametrize("inside_functions", [False, True], ids=["module level", "anywhere"])
def test_no_import_cycles(inside_functions):
    """Not at module level, and not through imports inside functions either (a function that
    imports its own importer hides a cycle until it runs)."""
    graph = package_imports(inside_functions)
    assert len(graph) > 30, "the walk found the package"
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for dep in sorted(graph[module]):
            assert state.get(dep) != "open", f"import cycle: {' -> '.join(path + [dep])}"
            if dep not in state:
                visit(dep, path + [dep])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_the_walk_sees_imports_inside_functions():
    """The command line imports its commands inside functions (`--help` stays torch-free)."""
    assert "minivtc.engine.factory" not in package_imports()["minivtc.cli.serve"]
    assert "minivtc.engine.factory" in package_imports(inside_functions=True)["minivtc.cli.serve"]


CORE = ("minivtc.requests", "minivtc.fairness", "minivtc.model", "minivtc.engine")


def test_the_core_does_not_import_the_layers_above_it():
    for module, deps in package_imports(inside_functions=True).items():
        if module.startswith(
            ("minivtc.requests", "minivtc.fairness", "minivtc.model", "minivtc.engine")
        ):
            above = [d for d in deps if d.startswith(("minivtc.serving", "minivtc.sim"))]
            assert not above, f"{module} imports {above}"


# The package's wings (README, "Where things are"): the core computes, the front doors serve it,
# the experiments run it, the tooling measures and teaches it. The core imports none of the rest.
WINGS = {
    "core": ("requests", "model", "fairness", "engine", "sim", "fleet"),
    "front doors": ("offline", "serving", "gateway", "vllm_plugin", "cli"),
    "experiments": ("experiments",),
    "tooling": ("bench", "course"),
}


def test_the_core_wing_imports_no_front_door_experiment_or_tool():
    core = WINGS["core"]
    rest = {f for wing, folders in WINGS.items() if wing != "core" for f in folders}
    for module, deps in package_imports(inside_functions=True).items():
        if folder(module) in core:
            above = sorted(d for d in deps if folder(d) in rest)
            assert not above, f"{module} (the core) imports {above}"


# The README's table, from the bottom up: a folder imports only folders before it here
LAYERS = (
    *("requests", "model", "fairness", "engine", "sim", "fleet", "experiments"),
    *("offline", "serving", "gateway", "vllm_plugin", "bench", "course", "cli"),
)


def test_a_folder_imports_only_the_folders_below_it_and_the_readme_lists_them_so():
    for module, deps in package_imports(inside_functions=True).items():
        if folder(module) in LAYERS:
            here = LAYERS.index(folder(module))
            above = sorted(d for d in deps if folder(d) in LAYERS[here + 1 :])
            assert not above, f"{module} imports {above}, above it"
    readme = (Path(minivtc.__file__).parent.parent / "README.md").read_text()
    listed = re.findall(r"^\| [a-z ]+ \| `minivtc/(\w+)/` \|", readme, re.M)
    assert tuple(f for f in listed if f in LAYERS) == LAYERS


def test_every_folder_belongs_to_one_wing():
    root = Path(minivtc.__file__).parent
    folders = {p.parent.name for p in root.glob("*/__init__.py")}
    named = [f for folders_ in WINGS.values() for f in folders_]
    assert sorted(named) == sorted(folders), "a folder outside the wings, or one named twice"


def folder(module: str) -> str:
    """`minivtc.engine.kv_pool` -> `engine`; the package's own root modules -> `minivtc`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else "minivtc"


def test_no_folder_imports_a_folder_that_imports_it_back():
    """The folders are layers: a pair that imports each other (at module level or inside a
    function) is one concept split in two, or a layer reaching up."""
    reaches: dict[str, set[str]] = {}
    for module, deps in package_imports(inside_functions=True).items():
        for dep in deps:
            if folder(dep) not in (folder(module), "minivtc"):
                reaches.setdefault(folder(module), set()).add(folder(dep))
    pairs = sorted(
        (a, b) for a in reaches for b in reaches[a] if a < b and a in reaches.get(b, set())
    )
    assert not pairs, f"folders importing each other: {pairs}"


def test_the_package_root_holds_only_entry_points():
    root = Path(minivtc.__file__).parent
    assert sorted(p.name for p in root.glob("*.py")) == ["__init__.py", "__main__.py"]


def test_no_module_name_is_used_twice():
    """A name says which room it is: two `cli.py` or two `bench.py` say nothing."""
    root = Path(minivtc.__file__).parent
    names = [p.stem for p in root.rglob("*.py") if not p.stem.startswith("__")]
    assert not [n for n in set(names) if names.count(n) > 1]


def package_trees() -> dict[str, ast.Module]:
    return {
        p.relative_to(PACKAGE).as_posix(): ast.parse(p.read_text())
        for p in PACKAGE.rglob("*.py")
        if "__pycache__" not in p.parts
    }


def isinstance_tests_of(name: str) -> list[str]:
    """Where a package module asks `isinstance(x, name)`: the interface it bypasses."""
    return [
        f"{path}:{node.lineno}"
        for path, tree in package_trees().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "isinstance"
        and len(node.args) == 2
        and name in ast.unparse(node.args[1])
    ]


@pytest.mark.slow
def test_no_module_asks_which_policy_or_which_pool_it_has():
    """The scheduler interface offers what callers need of VTC (counters, weights, settle,
    unadmit, ...), and the allocator its cached reservation: nobody tests for the class."""
    assert [p for p in isinstance_tests_of("VTC") if not p.startswith("fairness/vtc.py")] == []
    cached = isinstance_tests_of("PrefixCachingAllocator")
    assert [p for p in cached if not p.startswith("engine/prefix_cache.py")] == []


def test_no_function_takes_more_than_eight_parameters():
    """One engine config (`engine/engine_config.py`) in place of parallel signatures: a function
    needing more than 8 parameters wants a value that holds them."""
    long = set()
    for path, tree in package_trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
                n -= bool(a.args) and a.args[0].arg in ("self", "cls")
                if n > 8:
                    long.add(f"{path}:{node.name}")
    assert not long, sorted(long)


def declared_api(path: Path) -> set[str] | None:
    """A module's `__all__` (its API: what other modules, the tests and the lessons import from
    it), or None if it declares none."""
    names: set[str] | None = None
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            names = set()
        elif not (isinstance(node, ast.AugAssign) and getattr(node.target, "id", "") == "__all__"):
            continue
        assert names is not None, f"{path}: __all__ += before __all__ ="
        names |= {ast.literal_eval(e) for e in node.value.elts}  # type: ignore[attr-defined]
    return names


def module_path(dotted: str) -> Path | None:
    base = PACKAGE.parent / Path(*dotted.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def test_every_module_declares_its_api_and_others_import_only_that():
    """Each module's `__all__` says which of its names other modules may use; the rest are its
    own parts. Every `from minivtc.x import name` in the package and the tests names a module or
    a name in x's `__all__`, so a reader can tell a module's API from a step's parts."""
    undeclared = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        has_defs = any(isinstance(n, (ast.FunctionDef, ast.ClassDef)) for n in tree.body)
        if path.name != "__main__.py" and (path.name != "__init__.py" or has_defs):
            if declared_api(path) is None:
                undeclared.append(str(path.relative_to(PACKAGE)))
    assert not undeclared, f"modules without __all__: {undeclared}"
    outside = []
    for path in sorted(PACKAGE.rglob("*.py")) + sorted(PACKAGE.parent.glob("tests/*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("minivtc")):
                continue
            source = module_path(node.module)  # type: ignore[arg-type]
            api = declared_api(source) if source is not None else None
            for alias in node.names:
                if api is None or alias.name in api or module_path(f"{node.module}.{alias.name}"):
                    continue
                if source == path:
                    continue
                outside.append(f"{path.name}: {node.module}.{alias.name}")
    assert not outside, f"imports of names outside their module's __all__: {outside}"


def top_class(path: str, name: str) -> ast.ClassDef:
    tree = package_trees()[path]
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def test_the_classes_a_student_reads_stay_the_size_of_the_paper_s_loop():
    """VTC is Algorithm 2 and nothing else (its books are `VTCLedger`'s), `Engine.step` reads as
    pseudocode on one screen, and no module is longer than a reader holds at once."""
    vtc, engine = top_class("fairness/vtc.py", "VTC"), top_class("engine/engine.py", "Engine")
    step = next(n for n in engine.body if isinstance(n, ast.FunctionDef) and n.name == "step")
    sizes = {name: n.end_lineno - n.lineno + 1 for name, n in [("VTC", vtc), ("Engine", engine)]}
    sizes["Engine.step"] = step.end_lineno - step.lineno + 1
    assert sizes["VTC"] <= 160 and sizes["Engine"] <= 220 and sizes["Engine.step"] <= 20, sizes
    long = {p: len(PACKAGE.joinpath(p).read_text().splitlines()) for p in package_trees()}
    assert not {p: n for p, n in long.items() if n > 350}
