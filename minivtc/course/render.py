"""Readable copies of the lessons: each one executed and written as a self-contained HTML page.

Owns `render(out)` (the commands `minivtc course render OUT` and `minivtc course site OUT`).
The lessons are stored without outputs, so that a diff shows only what a person changed
(lessons/README.md); a reader who wants one with its numbers and figures, without running it,
opens the page this writes. Each lesson runs as the tests run it (`tests/test_lessons.py`): a
fresh kernel, `MINIVTC_LESSON_QUICK=1`, and no window for figures, in a scratch copy of the
lessons' directory (what a lesson writes, `out/lessonN/`, stays there: nothing is written
into `lessons/`). It runs with its solutions (each exercise's check asserts on the answer its
solution fills in); then one run gives either edition's page:

- the **student** edition (the default): the cells tagged "solution" are dropped, as in the
  student edition (`edition.py`), and so are the outputs of each exercise's check, the cell
  after its solution (they would show the reference solution's results): the page shows the
  exercise, its empty answer cell and the check's code;
- the **instructor**'s: every cell, solutions and checks' outputs included.

`site(out)` writes both, OUT/student/ and OUT/instructor/, and OUT/index.html linking them.
Each edition's `index.html` links its pages in lesson order. Does not own the lessons' content.
"""

from __future__ import annotations

import html
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from minivtc.course.edition import REPOSITORY

__all__ = ["EDITIONS", "LESSONS", "render", "site", "write_indexes", "write_pages"]

if TYPE_CHECKING:
    from nbformat import NotebookNode

LESSONS = REPOSITORY / "lessons"  # in a checkout: the instructor's lessons, with solutions
# As tests/test_lessons.py runs them, except the figures: Agg (the tests' backend) makes
# plt.show() draw nothing, the inline backend puts each figure in the cell's outputs as a PNG.
LESSON_ENV = {
    "MINIVTC_LESSON_QUICK": "1",
    "MPLBACKEND": "module://matplotlib_inline.backend_inline",
}
NOTES = {
    "student": "*A rendered copy of the student edition, made by `minivtc course render` with "
    "`MINIVTC_LESSON_QUICK=1` (Lesson 0 replays seconds of traffic, not a minute). The "
    "exercises' solutions and their checks' outputs are left out.*",
    "instructor": "*A rendered copy of the instructor's edition, made by `minivtc course "
    "render --instructor` with `MINIVTC_LESSON_QUICK=1`: solutions and checks' outputs "
    "included.*",
}
EDITIONS = tuple(NOTES)


def render(
    out: str | Path,
    lessons: str | Path = LESSONS,
    only: list[str] | None = None,
    editions: tuple[str, ...] = ("student",),
) -> Path:
    """Execute the lessons in `lessons` (those whose name starts with one of `only`, if given)
    once each, and write OUT/<lesson>.html for the one edition asked for (or, for several,
    OUT/<edition>/<lesson>.html), then the index(es). Returns the index's path."""
    out, lessons = Path(out), Path(lessons)
    unknown = sorted(set(editions) - set(EDITIONS))
    if unknown or not editions:
        raise ValueError(f"editions are {EDITIONS}, not {unknown or editions}")
    paths = select(lessons, only)
    folders = {e: out / e if len(editions) > 1 else out for e in editions}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    print(f"running {len(paths)} lesson(s), each in a fresh kernel...", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="minivtc-render-") as scratch:
        copy = Path(scratch) / "lessons"
        shutil.copytree(lessons, copy, ignore=shutil.ignore_patterns("out", ".ipynb_checkpoints"))
        for path in paths:
            start = time.monotonic()
            write_pages(executed(copy / path.name), path.stem, folders, copy)
            print(f"{path.stem}: {time.monotonic() - start:.1f} s", file=sys.stderr)
    return write_indexes(lessons, out, folders)


def write_pages(book: NotebookNode, stem: str, folders: dict[str, Path], lessons: Path) -> None:
    """One executed lesson's page for each edition, FOLDER/<stem>.html (`lessons`: the folder
    it ran in, where the images its markdown links are)."""
    for edition, folder in folders.items():
        page = to_html(edition_of(book, edition), lessons)
        (folder / f"{stem}.html").write_text(page, encoding="utf-8")


def write_indexes(lessons: Path, out: Path, folders: dict[str, Path]) -> Path:
    """Each edition's index of the pages in its folder, and (several editions) the site's
    front page linking them; returns the top index's path."""
    for edition, folder in folders.items():
        (folder / "index.html").write_text(index_page(lessons, folder, edition), encoding="utf-8")
    if len(folders) == 1:
        return next(iter(folders.values())) / "index.html"
    index = out / "index.html"
    index.write_text(site_page(lessons, out, tuple(folders)), encoding="utf-8")
    return index


def site(out: str | Path, lessons: str | Path = LESSONS, only: list[str] | None = None) -> Path:
    """The static site: both editions' pages and an index linking them (`course site`)."""
    return render(out, lessons, only, EDITIONS)


def select(lessons: Path, only: list[str] | None) -> list[Path]:
    """The lessons (NN_name.ipynb, in order), or those whose name starts with one of `only`."""
    paths = sorted(lessons.glob("[0-9][0-9]_*.ipynb"))
    if not paths:
        raise FileNotFoundError(f"no lessons (NN_name.ipynb) in {lessons}: pass --lessons DIR")
    if only is None:
        return paths
    unknown = [n for n in only if not any(p.name.startswith(n) for p in paths)]
    if unknown:
        names = ", ".join(p.stem for p in paths)
        raise ValueError(f"no lesson named {', '.join(unknown)}: choose from {names}")
    return [p for p in paths if any(p.name.startswith(n) for n in only)]


def executed(path: Path) -> NotebookNode:
    """The lesson run top to bottom in a fresh kernel, in its own folder, solutions in."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    book = nbformat.read(path, as_version=4)
    client = NotebookClient(
        book, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    try:
        client.execute(env={**os.environ, **LESSON_ENV})
    except CellExecutionError as e:
        raise RuntimeError(f"{path.name} failed to run:\n{e}") from e
    return book


def edition_of(book: NotebookNode, edition: str) -> NotebookNode:
    """The executed lesson as `edition` shows it: the student's without the solution cells and
    without the outputs of the check that follows each; the instructor's whole."""
    import copy

    import nbformat

    shown = copy.deepcopy(book)
    if edition == "student":
        cells = []
        after_solution = False
        for cell in shown.cells:
            if is_solution(cell):
                after_solution = True
                continue
            if after_solution and cell.cell_type == "code":
                cell.outputs = []  # the check's output is the reference solution's
                cell.execution_count = None
            after_solution = False
            cells.append(cell)
        shown.cells = cells
    shown.cells.insert(1, nbformat.v4.new_markdown_cell(NOTES[edition]))
    return shown


def is_solution(cell) -> bool:
    return "solution" in cell.metadata.get("tags", [])


def to_html(book: NotebookNode, folder: Path) -> str:
    """One self-contained page: the outputs' figures are embedded, and so are images that
    the markdown links (`embed_images`), read relative to the lesson's folder."""
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(embed_images=True)
    body, _ = exporter.from_notebook_node(book, resources={"metadata": {"path": str(folder)}})
    return body


def index_page(lessons: Path, out: Path, edition: str = "student") -> str:
    """Links to every lesson with a page in `out` (earlier renders included), in order."""
    items = "\n".join(
        f'<li><a href="{p.stem}.html">{html.escape(title(p))}</a></li>'
        for p in sorted(lessons.glob("[0-9][0-9]_*.ipynb"))
        if (out / f"{p.stem}.html").exists()
    )
    what = {
        "student": "the student edition: solutions and their checks' outputs left out",
        "instructor": "the instructor's edition: solutions included",
    }[edition]
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>minivtc lessons</title>'
        "</head>\n<body>\n<h1>minivtc lessons</h1>\n<p>Executed copies of the lessons, "
        f"to read without running them; {what}.</p>\n<ul>\n{items}\n</ul>\n"
        "</body></html>\n"
    )


def site_page(lessons: Path, out: Path, editions: tuple[str, ...]) -> str:
    """The site's front page: each edition's lessons with a page in `out`, linked."""
    sections = []
    for edition in editions:
        items = "\n".join(
            f'<li><a href="{edition}/{p.stem}.html">{html.escape(title(p))}</a></li>'
            for p in sorted(lessons.glob("[0-9][0-9]_*.ipynb"))
            if (out / edition / f"{p.stem}.html").exists()
        )
        sections.append(f'<h2><a href="{edition}/index.html">The {edition} edition</a></h2>')
        sections.append(f"<ul>\n{items}\n</ul>")
    body = "\n".join(sections)
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>minivtc: the course</title>'
        "</head>\n<body>\n<h1>minivtc: the course</h1>\n<p>The lessons, executed, to read "
        "without running them. The student edition leaves the exercises' solutions and their "
        f"checks' outputs out; the instructor's keeps them.</p>\n{body}\n</body></html>\n"
    )


def title(path: Path) -> str:
    """The lesson's first heading ("Lesson 3 — Continuous batching"), or its file name."""
    import nbformat

    first = nbformat.read(path, as_version=4).cells[0].source.splitlines()
    return first[0].lstrip("# ").strip() if first and first[0].startswith("#") else path.stem
