"""The architecture, executable: the policy layer never sees tensors, and no module imports a
module that imports it back.

Each check runs in a fresh interpreter, so what another test imported does not count.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "minivtc"

TORCH_FREE = [  # the scheduler sees requests, counters and a memory budget, never tensors
    "minivtc",
    "minivtc.core.scheduler",
    "minivtc.core.vtc",
    "minivtc.core.policies",
    "minivtc.core.predictors",
    "minivtc.core.cost",
    "minivtc.core.params",
    "minivtc.core.request",
    "minivtc.core.admission",
    "minivtc.core.engine",
    "minivtc.harness.sim",
    "minivtc.harness.step_time",
    "minivtc.harness.workloads",
    "minivtc.harness.metrics",
    "minivtc.cli",
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
from minivtc.cli import main
for argv in (["--help"], *([c, "--help"] for c in ("simulate", "serve", "reproduce",
             "calibrate", "loadgen", "generate", "demo", "bench"))):
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            main(argv)
        except SystemExit:
            pass
"""
    assert "torch" not in modules_loaded_by(code)


def package_imports() -> dict[str, set[str]]:
    """module -> the package modules it imports at module level (not inside functions or
    under TYPE_CHECKING), read from the source."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        name = name.removesuffix(".__init__")
        deps = set()
        for node in ast.parse(path.read_text()).body:  # top level only
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps.add(node.module)
                deps.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[name] = {d for d in deps if d.startswith("minivtc.")}
    return {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}


def test_no_import_cycles():
    graph = package_imports()
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


def test_the_core_does_not_import_the_layers_above_it():
    for module, deps in package_imports().items():
        if module.startswith("minivtc.core"):
            above = [d for d in deps if d.startswith(("minivtc.serving", "minivtc.harness"))]
            assert not above, f"{module} imports {above}"
