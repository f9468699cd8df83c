"""Readable copies of the lessons: each one executed and written as a self-contained HTML page.

Owns `render(out)` (the command `minivtc course render OUT`). The lessons are stored without
outputs, so that a diff shows only what a person changed (lessons/README.md); a student who
wants to read one with its numbers and figures, without running it, opens the page this writes.
Each lesson runs as the tests run it (`tests/test_lessons.py`): a fresh kernel, the lessons
directory as its working directory, `MINIVTC_LESSON_QUICK=1`, and no window for figures. Then the
cells tagged "solution" are dropped, as in the student edition (`edition.py`): the page must
not give the exercises away, so it shows each exercise, its empty answer cell and the check
cell with the check's output (the reference solution's), but not the solution's code.
`index.html` links the pages in lesson order. Does not own the lessons' content.
"""

from __future__ import annotations

import html
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from minivtc.course.edition import REPOSITORY

if TYPE_CHECKING:
    from nbformat import NotebookNode

LESSONS = REPOSITORY / "lessons"  # in a checkout: the instructor's lessons, with solutions
# As tests/test_lessons.py runs them, except the figures: Agg (the tests' backend) makes
# plt.show() draw nothing, the inline backend puts each figure in the cell's outputs as a PNG.
LESSON_ENV = {
    "MINIVTC_LESSON_QUICK": "1",
    "MPLBACKEND": "module://matplotlib_inline.backend_inline",
}
NOTE = (
    "*A rendered copy, made by `minivtc course render` with `MINIVTC_LESSON_QUICK=1` (Lesson 0 "
    "replays seconds of traffic, not a minute). The exercises' solution cells are left out; "
    "each check's output is the reference solution's.*"
)


def render(out: str | Path, lessons: str | Path = LESSONS, only: list[str] | None = None) -> Path:
    """Execute the lessons in `lessons` (those whose name starts with one of `only`, if given)
    and write OUT/<lesson>.html for each, then OUT/index.html. Returns the index's path."""
    out, lessons = Path(out), Path(lessons)
    paths = select(lessons, only)
    out.mkdir(parents=True, exist_ok=True)
    print(f"running {len(paths)} lesson(s), each in a fresh kernel...", file=sys.stderr)
    for path in paths:
        start = time.monotonic()
        book = executed(path)
        (out / f"{path.stem}.html").write_text(to_html(book, path.parent), encoding="utf-8")
        print(f"{path.stem}: {time.monotonic() - start:.1f} s", file=sys.stderr)
    index = out / "index.html"
    index.write_text(index_page(lessons, out), encoding="utf-8")
    return index


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
    """The lesson run top to bottom in a fresh kernel, its solution cells then dropped (they
    must run first: each check asserts on the answer its solution fills in)."""
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
    book.cells = [c for c in book.cells if "solution" not in c.metadata.get("tags", [])]
    book.cells.insert(1, nbformat.v4.new_markdown_cell(NOTE))
    return book


def to_html(book: NotebookNode, folder: Path) -> str:
    """One self-contained page: the outputs' figures are embedded, and so are images that
    the markdown links (`embed_images`), read relative to the lesson's folder."""
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(embed_images=True)
    body, _ = exporter.from_notebook_node(book, resources={"metadata": {"path": str(folder)}})
    return body


def index_page(lessons: Path, out: Path) -> str:
    """Links to every lesson with a page in `out` (earlier renders included), in order."""
    items = "\n".join(
        f'<li><a href="{p.stem}.html">{html.escape(title(p))}</a></li>'
        for p in sorted(lessons.glob("[0-9][0-9]_*.ipynb"))
        if (out / f"{p.stem}.html").exists()
    )
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>minivtc lessons</title>'
        "</head>\n<body>\n<h1>minivtc lessons</h1>\n<p>Executed copies of the lessons, "
        f"to read without running them; solutions left out.</p>\n<ul>\n{items}\n</ul>\n"
        "</body></html>\n"
    )


def title(path: Path) -> str:
    """The lesson's first heading ("Lesson 3 — Continuous batching"), or its file name."""
    import nbformat

    first = nbformat.read(path, as_version=4).cells[0].source.splitlines()
    return first[0].lstrip("# ").strip() if first and first[0].startswith("#") else path.stem
