"""The lessons: stored without outputs, shaped as the course promises, and run top to bottom.

Each notebook is executed with nbclient in a fresh kernel, as a student would run it, with
MINIVTC_LESSON_QUICK=1 (the one lesson that runs real traffic for minutes, Lesson 0, then runs
for seconds; no cell is skipped). With MINIVTC_LESSON_FULL=1 they run at full length instead:
`.ci/run` does that for the lessons that read MINIVTC_LESSON_QUICK, while two busy processes
compete for the cores, since a student's laptop is a slow, busy machine. Its exercise checks are
asserts, so a wrong reference solution or a broken package API fails here.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from tests.answers import leaked, page_text, reference_bodies

nbformat = pytest.importorskip("nbformat")

LESSONS_DIR = Path(__file__).parent.parent / "lessons"
LESSONS = sorted(LESSONS_DIR.glob("[0-9][0-9]_*.ipynb"))
PROBLEMS = sorted((LESSONS_DIR / "problems").glob("[0-9][0-9]_*.ipynb"))


def test_there_are_sixteen_lessons_linked_in_order_from_both_readmes():
    assert [p.name[:2] for p in LESSONS] == [f"{i:02d}" for i in range(16)]
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


def test_the_syllabus_links_every_lesson_and_problem_set_in_order_and_is_linked():
    text = (LESSONS_DIR / "SYLLABUS.md").read_text()
    for books in (LESSONS, PROBLEMS):
        positions = [text.find(f"({p.relative_to(LESSONS_DIR)})") for p in books]
        assert -1 not in positions and positions == sorted(positions), positions
    assert "(SYLLABUS.md)" in (LESSONS_DIR / "README.md").read_text()
    assert len(PROBLEMS) >= 2


@pytest.mark.parametrize("path", PROBLEMS, ids=lambda p: p.stem)
def test_problem_set_is_stored_without_outputs_and_every_answer_is_hidden_and_checked(path):
    """A problem set (lessons/problems/): each worked answer is a cell tagged "solution", as
    the lessons' are, so the student edition leaves it out; the cell after it checks it."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert all(not c.outputs for c in nb.cells if c.cell_type == "code"), f"{path.name}: outputs"
    assert "**Covers:**" in nb.cells[0].source and "**Paper:**" in nb.cells[0].source
    answers = [i for i, c in enumerate(nb.cells) if "solution" in c.metadata.get("tags", [])]
    assert len(answers) >= 3, f"{path.name}: a problem set has worked answers"
    for i in answers:
        assert nb.cells[i].metadata["jupyter"]["source_hidden"], "answers start collapsed"
        check = nb.cells[i + 1]
        assert check.cell_type == "code" and "assert" in check.source, (
            f"{path.name}: the cell after a worked answer must check it"
        )


@pytest.mark.slow
@pytest.mark.parametrize("path", PROBLEMS, ids=lambda p: p.stem)
def test_problem_set_runs_top_to_bottom_and_its_student_copy_has_no_answers(
    path, monkeypatch, capsys, tmp_path
):
    from nbclient import NotebookClient

    from minivtc.course.edition import without_solutions

    monkeypatch.setenv("MINIVTC_LESSON_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    start = time.monotonic()
    client.execute()
    with capsys.disabled():
        print(f"\n{path.name}: ran in {time.monotonic() - start:.1f} s")
    printed = "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
    )
    assert printed.count("correct") >= 1, "the answers' checks should print their result"
    shown = "\n".join(
        text_of(o)
        for c in nb.cells
        if c.cell_type == "code" and "solution" not in c.metadata.get("tags", [])
        for o in c.outputs
    )
    assert not leaked(reference_bodies(), shown), leaked(reference_bodies(), shown)
    copy = tmp_path / path.name
    copy.write_text(path.read_text())
    without_solutions(copy)  # what the student edition does to it
    student = nbformat.read(copy, as_version=4)
    assert not any("solution" in c.metadata.get("tags", []) for c in student.cells)
    assert len(student.cells) == len(nb.cells) - sum(
        "solution" in c.metadata.get("tags", []) for c in nb.cells
    )


@pytest.fixture(scope="session")
def site_dir(tmp_path_factory) -> Path:
    """The course's static site (`minivtc course site`), built here from the lessons' own runs
    below: each lesson runs once in CI, and its two pages are written from that run."""
    return tmp_path_factory.mktemp("site")


def site_folders(site: Path) -> dict[str, Path]:
    from minivtc.course.render import EDITIONS

    folders = {edition: site / edition for edition in EDITIONS}
    for folder in folders.values():
        folder.mkdir(exist_ok=True)
    return folders


@pytest.mark.slow
@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_lesson_runs_top_to_bottom(path, monkeypatch, capsys, site_dir):
    from nbclient import NotebookClient

    from minivtc.course.render import write_pages

    if os.environ.get("MINIVTC_LESSON_FULL"):  # CI's second run: full length, a busy machine
        monkeypatch.delenv("MINIVTC_LESSON_QUICK", raising=False)
    else:
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
    write_pages(nb, path.stem, site_folders(site_dir), LESSONS_DIR)
    student = page_text((site_dir / "student" / f"{path.stem}.html").read_text())
    assert not re.search(r"^correct: ", student, re.M)  # the checks' outputs: the reference's
    assert not leaked(reference_bodies(), student), leaked(reference_bodies(), student)


@pytest.mark.slow
def test_the_course_site_is_built_from_the_lessons_run_here(site_dir):
    """Both editions' pages of every lesson (`course site`'s output), with their indexes:
    every page linked in order, figures embedded."""
    from minivtc.course.render import write_indexes

    missing = [p.stem for p in LESSONS if not (site_dir / "student" / f"{p.stem}.html").exists()]
    if missing:
        pytest.skip(f"the site is built from this run's lessons, and these did not run: {missing}")
    index = write_indexes(LESSONS_DIR, site_dir, site_folders(site_dir))
    front = index.read_text()
    for edition in ("student", "instructor"):
        pages = (site_dir / edition / "index.html").read_text()
        links = [pages.find(f'href="{p.stem}.html"') for p in LESSONS]
        assert -1 not in links and links == sorted(links), (edition, links)
        assert f'href="{edition}/index.html"' in front
    figures = sum("data:image/png;base64," in p.read_text() for p in site_dir.rglob("*.html"))
    assert figures >= 12, figures  # most lessons draw; each page embeds its own


def text_of(output: dict) -> str:
    """An output as a reader sees it: printed text, or a value's plain-text form."""
    return output.get("text", "") + output.get("data", {}).get("text/plain", "")
