"""The lessons: stored without outputs, shaped as the course promises, and run top to bottom.

Each notebook is executed with nbclient in a fresh kernel, as a student would run it, with
MINIVTC_LESSON_QUICK=1 (the one lesson that runs real traffic for minutes, Lesson 0, then runs
for seconds; no cell is skipped). Its exercise checks are asserts, so a wrong reference
solution or a broken package API fails here.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.answers import leaked, reference_bodies

nbformat = pytest.importorskip("nbformat")

LESSONS_DIR = Path(__file__).parent.parent / "lessons"
LESSONS = sorted(LESSONS_DIR.glob("[0-9][0-9]_*.ipynb"))


def test_there_are_twelve_lessons_linked_in_order_from_both_readmes():
    assert [p.name[:2] for p in LESSONS] == [f"{i:02d}" for i in range(12)]
    for readme in (LESSONS_DIR / "README.md", LESSONS_DIR.parent / "README.md"):
        text = readme.read_text()
        positions = [text.find(p.name) for p in LESSONS]
        assert -1 not in positions, f"{readme} does not link every lesson"
        assert positions == sorted(positions), f"{readme} lists the lessons out of order"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_lesson_is_stored_without_outputs_and_has_checked_exercises(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), (
        f"{path.name} has stored outputs: clear them before committing (diff-friendly storage)"
    )
    assert nb.cells[0].cell_type == "markdown" and "**Covers:**" in nb.cells[0].source
    assert "**Paper:**" in nb.cells[0].source
    solutions = [i for i, c in enumerate(nb.cells) if "solution" in c.metadata.get("tags", [])]
    assert 1 <= len(solutions) <= 3, f"{path.name}: 1-3 exercises, each with a hidden solution"
    for i in solutions:
        assert nb.cells[i].metadata["jupyter"]["source_hidden"], "solutions start collapsed"
        check = nb.cells[i + 1]
        assert check.cell_type == "code" and "assert" in check.source, (
            f"{path.name}: the cell after a solution must check the answer"
        )


@pytest.mark.slow
@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_lesson_runs_top_to_bottom(path, monkeypatch, capsys):
    from nbclient import NotebookClient

    monkeypatch.setenv("MINIVTC_LESSON_QUICK", "1")
    # The inline backend (headless): plt.show() draws each figure into the outputs, so a
    # drawing error fails here, as it would for a student (Agg would draw nothing on show()).
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(LESSONS_DIR)}}
    )
    start = time.monotonic()
    client.execute()
    with capsys.disabled():
        print(f"\n{path.name}: ran in {time.monotonic() - start:.1f} s")
    printed = "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
    )
    assert printed.count("correct") >= 1, "the exercise checks should print their result"
    # What the student edition's rendered page shows of this run (every cell but the
    # exercises' solutions) holds no assignment's reference body (`course render` runs the
    # lessons with the reference package, so a cell printing a function's source would).
    shown = "\n".join(
        text_of(o)
        for c in nb.cells
        if c.cell_type == "code" and "solution" not in c.metadata.get("tags", [])
        for o in c.outputs
    )
    assert not leaked(reference_bodies(), shown), leaked(reference_bodies(), shown)


def text_of(output: dict) -> str:
    """An output as a reader sees it: printed text, or a value's plain-text form."""
    return output.get("text", "") + output.get("data", {}).get("text/plain", "")
