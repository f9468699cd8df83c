"""The instructor's pages (minivtc/course/instructor/): kept out of the student edition, one
per syllabus week, and held to the numbers they quote: the grader's rubrics (`ASSIGNMENTS`),
the problem sets' totals, the notebooks' problems and the catalogue's wrong solutions."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from minivtc.course.assignments import ASSIGNMENTS
from minivtc.course.edition import PACKAGE, REPOSITORY, release

PAGES = PACKAGE / "course" / "instructor"
SYLLABUS = REPOSITORY / "lessons" / "SYLLABUS.md"
PROBLEM_SETS = sorted(PAGES.glob("problem_set_*.md"))
WEEK_PAGES = sorted(PAGES.glob("week_*.md"))
BY_KEY = {a.key: a for a in ASSIGNMENTS}
RUBRIC_HEADER = ["assignment", "rubric line", "points"]


def tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every markdown table of `text`: its header's cells and its rows' cells."""
    found, lines = [], text.splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.lstrip().startswith("|") and lines[i + 1].lstrip().startswith("| ---"):
            header, rows = cells(line), []
            for row in lines[i + 2 :]:
                if not row.lstrip().startswith("|"):
                    break
                rows.append(cells(row))
                assert len(rows[-1]) == len(header), f"a row with a stray '|': {row}"
            found.append((header, rows))
    return found


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def stated_total(text: str) -> int:
    totals = re.findall(r"\*\*Total: (\d+) points\.\*\*", text)
    assert len(totals) == 1, "a rubric page states its total once"
    return int(totals[0])


def syllabus_weeks() -> dict[int, str]:
    """The syllabus's weeks: number -> its 'assignments' cell."""
    weeks_table = SYLLABUS.read_text().split("## The weeks", 1)[1]
    header, rows = tables(weeks_table)[0]
    assert header[0] == "week" and "assignments" in header
    return {int(row[0]): row[header.index("assignments")] for row in rows}


def rubric_rows(page: Path) -> list[list[str]]:
    return [row for h, rows in tables(page.read_text()) if h == RUBRIC_HEADER for row in rows]


# --- the edition -----------------------------------------------------------------------------


def page_lines() -> dict[str, list[str]]:
    """Each page's lines long enough to be its own text (no table rule, no short cell)."""
    return {
        page.name: [
            s
            for s in (line.strip() for line in page.read_text().splitlines())
            if len(s) >= 50 and not s.startswith("| ---")
        ]
        for page in sorted(PAGES.glob("*.md"))
    }


def readable_text(root: Path) -> str:
    """Every text file under `root` as a student reads it (a notebook's cells, not its JSON)."""
    parts = []
    for path in sorted(root.rglob("*")):
        if path.suffix == ".ipynb":
            book = json.loads(path.read_text())
            parts += ["".join(c["source"]) for c in book["cells"]]
        elif path.suffix in (".py", ".md", ".toml", ".txt", ".json", ".html", ".cfg"):
            parts.append(path.read_text(errors="replace"))
    return "\n".join(parts)


def found_in(text: str) -> dict[str, list[str]]:
    return {name: [line for line in lines if line in text] for name, lines in page_lines().items()}


def test_the_search_for_the_pages_text_finds_it_where_it_is():
    """The check below can fail: run on the package itself, it finds every page's lines."""
    assert len(page_lines()) >= 17 and all(page_lines().values())
    assert found_in(readable_text(PAGES)) == page_lines()


def test_a_released_edition_holds_none_of_the_pages_and_no_text_of_them(tmp_path):
    edition = release(tmp_path / "e")
    assert not (edition / "minivtc" / "course" / "instructor").exists()
    names = {p.name for p in PAGES.glob("*.md")} - {"README.md"}
    assert not [p for p in edition.rglob("*") if p.name in names or p.name == "instructor"]
    leaked = {name: lines for name, lines in found_in(readable_text(edition)).items() if lines}
    assert not leaked, leaked


# --- the weeks ---------------------------------------------------------------------------------


def test_every_week_of_the_syllabus_has_a_page_and_the_index_links_it():
    weeks = syllabus_weeks()
    assert sorted(weeks) == list(range(1, len(weeks) + 1)) and len(weeks) == 13
    assert [p.name for p in WEEK_PAGES] == [f"week_{n:02d}.md" for n in weeks]
    index = (PAGES / "README.md").read_text()
    for n, page in zip(weeks, WEEK_PAGES, strict=True):
        assert page.read_text().startswith(f"# Week {n}: "), page.name
        assert f"({page.name})" in index, page.name
    for page in sorted(PAGES.glob("*.md")):
        assert page.name == "README.md" or f"({page.name})" in index, page.name


def test_every_rubric_a_week_page_names_is_the_grader_s():
    """Each rubric quoted on a week page is its assignment's whole rubric in `assignments.py`,
    line by line with its points, under a heading stating its total."""
    quoted = 0
    for page in WEEK_PAGES:
        text, rows = page.read_text(), rubric_rows(page)
        for key in sorted({row[0] for row in rows}):
            assignment = BY_KEY[key]
            lines = {row[1]: int(row[2]) for row in rows if row[0] == key}
            assert lines == {line.mechanism: line.points for line in assignment.rubric}, page
            assert f"## Due: {key}, {assignment.max_points} points" in text, (page.name, key)
            quoted += 1
    assert quoted == len(ASSIGNMENTS)


def test_each_assignment_s_rubric_is_on_the_page_of_the_week_it_is_due():
    for n, cell in syllabus_weeks().items():
        due = set(re.findall(r"\b([ad]\db?) due", cell))  # a1-a6, a4b, the design d1-d2
        named = {row[0].split("_")[0] for row in rubric_rows(PAGES / f"week_{n:02d}.md")}
        assert named == due, (n, named, due)


def test_the_wrong_answers_cited_are_the_catalogue_s():
    """Each wrong answer a page quotes is a description in the catalogue (`course/wrong*.py`),
    which the pages cite by its words."""
    files = sorted((PACKAGE / "course").glob("wrong*.py"))  # wrong.py, wrong_policies.py
    catalogue = " ".join(" ".join(f.read_text() for f in files).split())
    cited = 0
    for page in [*WEEK_PAGES, PAGES / "a6_argument.md"]:
        for section in re.split(r"\n#+ ", page.read_text()):
            if section.startswith(("The wrong answers you will see", "What to read for")):
                for quote in re.findall(r'"([^"]+)"', " ".join(section.split())):
                    assert f'"{quote}"' in catalogue, (page.name, quote)
                    cited += 1
    assert cited >= 6 * 8  # the catalogue holds at least 8 per assignment


# The lesson exercises that build a mechanism: lesson -> the function or class it asks for
BUILT = {
    0: "fair_rates",
    1: "nucleus",
    2: "KVCache",
    3: "chunked_prefill",
    5: "scfq",
    6: "service",
    7: "ShortfallAlarm",
    9: "deltas",
}


def lesson_weeks() -> dict[int, int]:
    """Each lesson -> the week the syllabus's weeks table gives it (its own week)."""
    weeks_table = SYLLABUS.read_text().split("## The weeks", 1)[1]
    header, rows = tables(weeks_table)[0]
    return {int(n): int(row[0]) for row in rows for n in re.findall(r"\[(\d\d)\]\(\d\d_", row[1])}


def test_each_exercise_that_builds_a_mechanism_is_on_its_lesson_s_week_page():
    week_of = lesson_weeks()
    for lesson, name in BUILT.items():
        (notebook,) = (REPOSITORY / "lessons").glob(f"{lesson:02d}_*.ipynb")
        assert f"Write `{name}" in readable_text_of(notebook), (lesson, name)
        page = PAGES / f"week_{week_of[lesson]:02d}.md"
        assert f"Lesson {lesson}'s `{name}" in page.read_text(), (page.name, name)


# "Lesson 5", "Lessons 0 and 4-7", "**Lessons:** 0 (the tour: ...), 1": the numbers after it
LESSON_RUN = r"Lessons?(?::\*\*)? (\d+(?:(?:,| and|-| \([^)]*\),?)\s*\d+)*)"


def lessons_named(sentence: str) -> set[int]:
    """The lessons a sentence names: "Lesson 5", "Lessons 0 and 4-7", "**Lessons:** 0 (...), 1"."""
    named: set[int] = set()
    for run in re.findall(LESSON_RUN, sentence):
        run = re.sub(r"\([^)]*\)", "", run)
        for a, b in re.findall(r"(\d+)(?:-(\d+))?", run):
            named |= set(range(int(a), int(b or a) + 1))
    return named


def not_in_their_week(text: str, week_of: dict[int, int]) -> list[str]:
    """Each sentence of `text` that has a lesson not run in its own week in the edition: it
    "runs ... from week N", N after the lesson's week, or a lesson is read as a page instead."""
    found = []
    for sentence in re.split(r"(?<=[.;])\s", " ".join(text.split())):
        lessons = lessons_named(sentence)
        late = [int(n) for n in re.findall(r"\bruns?\b[^.;]*?\bfrom week (\d+)", sentence)]
        if any(n > week_of[lesson] for n in late for lesson in lessons if lesson in week_of):
            found.append(sentence)
        elif re.search(r"\bread (?:as (?:its |rendered )?pages?|its page)", sentence):
            found.append(sentence)
    return found


def test_no_page_says_a_lesson_runs_after_its_own_week():
    """The syllabus: every lesson runs in the student edition in its own week (`staff.use()`);
    no instructor page may say one runs from a later week, or is read as a page until then."""
    week_of = lesson_weeks()
    also = [REPOSITORY / "lessons" / "README.md", SYLLABUS, PACKAGE / "course" / "README.md"]
    for page in [*sorted(PAGES.glob("*.md")), *also]:
        assert not not_in_their_week(page.read_text(), week_of), page.name


def test_the_week_check_finds_a_lesson_said_to_run_late():
    """The sentences the pages held when the edition ran Lessons 0-7 only from week 7."""
    week_of = lesson_weeks()
    said = [
        "**Lessons:** 0 (the tour: read its page, it runs in the edition from week 7), 1 (the "
        "Llama-2 forward pass).",
        "Lessons 0 and 4-7, read as rendered pages until now, run too.",
        "Lesson 5 runs in the edition from week 7.",
        "(a lesson whose assignments are not yet due in the student edition is read as its page "
        'until the syllabus\'s "runs from week")',
    ]
    assert [not_in_their_week(s, week_of) for s in said] == [[s] for s in said]
    assert not not_in_their_week("Lesson 8 runs in the edition from week 7.", week_of)


def readable_text_of(notebook: Path) -> str:
    return " ".join(
        " ".join("".join(c["source"]).split()) for c in json.loads(notebook.read_text())["cells"]
    )


# --- the problem sets ------------------------------------------------------------------------


def problem_rows(page: Path) -> list[list[str]]:
    return [
        row
        for header, rows in tables(page.read_text())
        if header[:3] == ["problem", "part", "points"]
        for row in rows
    ]


@pytest.mark.parametrize("page", PROBLEM_SETS, ids=lambda p: p.stem)
def test_a_problem_set_s_points_add_up_to_the_total_its_page_states(page):
    rows = problem_rows(page)
    assert rows and sum(int(row[2]) for row in rows) == stated_total(page.read_text())


def problems_of(notebook: Path) -> dict[int, str]:
    """A problem set's problems: number -> its statement (the markdown from its heading to the
    next problem's)."""
    book = json.loads(notebook.read_text())
    text = "\n".join("".join(c["source"]) for c in book["cells"] if c["cell_type"] == "markdown")
    pieces = re.split(r"^## Problem (\d+)\.", text, flags=re.M)
    return {int(n): body for n, body in zip(pieces[1::2], pieces[2::2], strict=True)}


@pytest.mark.parametrize("page", PROBLEM_SETS, ids=lambda p: p.stem)
def test_every_problem_a_rubric_covers_is_in_its_notebook(page):
    notebooks = set(re.findall(r"lessons/problems/[\w.]+\.ipynb", page.read_text()))
    assert len(notebooks) == 1, "a rubric page names its notebook"
    problems = problems_of(REPOSITORY / notebooks.pop())
    covered = set()
    for problem, part, *_ in problem_rows(page):
        number = int(problem.removeprefix("Problem "))
        assert number in problems, (page.name, problem)
        letter = re.match(r"\(([a-z])\)", part)
        if letter:
            assert f"**({letter[1]})**" in problems[number], (page.name, problem, part)
        covered.add(number)
    assert covered == set(problems), "every problem of the notebook has its points"


def test_the_problem_sets_number_their_problems_as_one_sequence():
    """Problem set 2 continues problem set 1's numbering, so "Problem 5" names one problem."""
    notebooks = sorted((REPOSITORY / "lessons" / "problems").glob("[0-9][0-9]_*.ipynb"))
    numbers = [n for notebook in notebooks for n in sorted(problems_of(notebook))]
    assert len(notebooks) == 2 and numbers == list(range(1, len(numbers) + 1)), numbers


# --- the policy --------------------------------------------------------------------------------


def test_the_policy_grades_with_the_points_the_rubrics_give_and_its_shares_add_to_100():
    header, rows = tables((PAGES / "policy.md").read_text())[0]
    assert header == ["part", "points as graded", "share of the course grade"]
    points = {row[0]: int(row[1].split()[0]) for row in rows}
    shares = [int(row[2].rstrip("%")) for row in rows]
    assert sum(shares) == 100
    own = [a for a in ASSIGNMENTS if a.own_file]
    assert [a.key for a in own] == ["a6_fair", "d1_quota", "d2_tenants"]
    assert points["assignments a1-a5 and a4b (`minivtc course grade`)"] == sum(
        a.max_points for a in ASSIGNMENTS if not a.own_file
    )
    assert points["capstone a6: the grader's points"] == own[0].max_points
    design = sum(a.max_points for a in own[1:])
    assert points["design assignments d1-d2: the grader's points"] == design
    argued = next(v for k, v in points.items() if k.startswith("design assignments d1-d2: their"))
    assert argued == stated_total((PAGES / "design_arguments.md").read_text())
    argument = stated_total((PAGES / "a6_argument.md").read_text())
    assert next(v for k, v in points.items() if "written argument" in k) == argument
    for n, page in enumerate(PROBLEM_SETS, start=1):
        expected = stated_total(page.read_text())
        assert next(v for k, v in points.items() if k.startswith(f"problem set {n}")) == expected
