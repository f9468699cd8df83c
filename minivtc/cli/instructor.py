"""`minivtc course release OUT`, `grade` and `render OUT`: the instructor's commands."""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_course"]


def add_course(sub) -> None:
    p = sub.add_parser(
        "course",
        help="coursework: write the student edition, grade it, render the lessons",
        description="Assignments in which students write the engine's mechanisms themselves "
        "(the Llama pieces, the block allocator, admission and one batching step, VTC, the "
        "paper's metric, and a capstone: a fair policy of their own, with its bound). "
        "`release OUT` writes the student edition; `grade OUT` grades it "
        "(each assignment alone, with a time limit) and writes OUT/grades.json; `render OUT` "
        "runs the lessons and writes readable HTML copies (outputs in, solutions out; "
        "--instructor: in); `site OUT` writes both editions' pages as a static site.",
    )
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    release = verbs.add_parser("release", help="write the student edition to OUT (a new dir)")
    release.add_argument("out", help="directory to create")
    release.set_defaults(run=run_release)
    grade = verbs.add_parser(
        "grade",
        help="grade an edition (or --reference), print points, write grades.json",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    grade.add_argument("edition", nargs="?", help="a student edition made by `course release`")
    grade.add_argument(
        "--reference",
        action="store_true",
        help="grade the package's own code (the reference solutions)",
    )
    grade.add_argument("--out", help="where grades.json goes (default: the edition)")
    grade.add_argument(
        "--time-limit", type=float, default=240.0, help="seconds per assignment before it scores 0"
    )
    grade.add_argument("--only", action="append", help="grade only this assignment (repeat)")
    grade.add_argument(
        "--verbose", action="store_true", help="print each assignment's full test output"
    )
    grade.add_argument(
        "--trust-submissions",
        action="store_true",
        help="grade without a sandbox where none starts (bubblewrap): only for work you trust",
    )
    grade.set_defaults(run=run_grade)
    add_check(verbs)
    test = verbs.add_parser(
        "test",
        help="run one assignment's graded tests on an edition, your code taken as the grader "
        "takes it (for students)",
    )
    test.add_argument("assignment", help="e.g. a4_vtc (or a4)")
    test.add_argument("edition", nargs="?", default=".", help="the edition (default: here)")
    test.set_defaults(run=run_test)
    add_render(verbs)


def add_check(verbs) -> None:
    check = verbs.add_parser(
        "check-grader",
        help="grade the catalogue of wrong solutions and the mutants of the reference",
        description="Does the grader tell wrong from right? Grades every wrong solution of "
        "minivtc/course/wrong.py (each must lose points) and every mutant of each "
        "assignment's reference functions (the share that loses points is the mutation "
        "score; the survivors are listed). Exits 1 if a wrong solution keeps full marks.",
    )
    check.add_argument("--only", action="append", help="check only this assignment (repeat)")
    check.add_argument("--catalogue-only", action="store_true", help="skip the mutation run")
    check.add_argument("--mutants-only", action="store_true", help="skip the catalogue")
    check.add_argument("--full", action="store_true", help="grade wrong solutions fully")
    check.add_argument("--jobs", type=int, default=1, help="graded runs at once")
    check.add_argument("--json", help="also write the results to this file")
    check.set_defaults(run=run_check)


def add_render(verbs) -> None:
    from minivtc.course.render import LESSONS

    render = verbs.add_parser(
        "render",
        help="run the lessons; write each as an HTML page to read without running",
        description="The lessons are stored without outputs. This runs each in a fresh kernel "
        "(MINIVTC_LESSON_QUICK=1, as the tests do) in a scratch copy of the lessons' directory "
        "(nothing is written into it) and writes OUT/NN_name.html (figures embedded) and "
        "OUT/index.html linking them: the student edition's pages (the exercises' solutions "
        "and their checks' outputs left out), or with --instructor the instructor's.",
    )
    render.add_argument("out", help="directory for the pages (created if missing)")
    render.add_argument(
        "--instructor", action="store_true", help="the instructor's edition: solutions included"
    )
    add_lesson_choice(render, LESSONS)
    render.set_defaults(run=run_render)
    site = verbs.add_parser(
        "site",
        help="the rendered course, both editions, as a static site",
        description="Runs each lesson once (as `render` does) and writes OUT/student/ and "
        "OUT/instructor/ (each with its index.html) and OUT/index.html linking both: a static "
        "site, figures embedded in the pages, to serve from any web server or open as files.",
    )
    site.add_argument("out", help="directory for the site (created if missing)")
    add_lesson_choice(site, LESSONS)
    site.set_defaults(run=run_site)


def add_lesson_choice(parser, lessons) -> None:
    parser.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="render only the lessons whose name starts with NAME, e.g. 05 (repeat)",
    )
    parser.add_argument(
        "--lessons", default=str(lessons), help="the lessons' directory (default: %(default)s)"
    )


def run_release(args) -> int:
    from minivtc.course.edition import release

    out = release(args.out)
    print(f"wrote the student edition to {out}: see {out / 'README.md'}")
    print(
        "readable copies of the lessons for students (executed, solutions left out): "
        "minivtc course render PAGES"
    )
    return 0


def run_grade(args) -> int:
    from minivtc.course import STUDENT_EDITION
    from minivtc.course.grade import grade, table

    if STUDENT_EDITION:  # its own package would be the "reference": every stub scores 0
        raise ValueError(
            "this is the student edition: grading runs your functions in the reference "
            "package, which is the instructor's. Run an assignment's graded tests on your "
            "edition as it stands with `minivtc course test KEY` (e.g. a4)"
        )
    if args.reference == bool(args.edition):
        raise ValueError("grade an EDITION, or the reference with --reference --out DIR")
    out = args.out or args.edition
    if out is None:
        raise ValueError("--reference needs --out DIR for grades.json")
    print(
        "grading (each assignment in a fresh process, a student's code sandboxed)...",
        file=sys.stderr,
    )

    def echo(key: str, output: str) -> None:
        print(f"--- {key}: the tests' output ---\n{output}", file=sys.stderr)

    edition = None if args.reference else args.edition
    echoed = echo if args.verbose else None
    result = grade(edition, out, args.time_limit, args.only, echoed, args.trust_submissions)
    print(table(result))
    print(f"wrote {out}/grades.json")
    return 0


def run_test(args) -> int:
    from minivtc.course.assignments import ASSIGNMENTS
    from minivtc.course.grade import table, test_edition

    keys = [a.key for a in ASSIGNMENTS if args.assignment in (a.key, a.key.split("_")[0])]
    if not keys:
        raise ValueError(
            f"no assignment {args.assignment!r}: one of {[a.key for a in ASSIGNMENTS]}"
        )
    result = test_edition(keys[0], args.edition)
    print(table(result))
    return 0 if result["total"] == result["max_total"] else 1


def run_check(args) -> int:
    from minivtc.course.check import run

    return run(args)


def run_render(args) -> int:
    from minivtc.course.render import render

    edition = "instructor" if args.instructor else "student"
    index = render(args.out, args.lessons, args.only, (edition,))
    print(f"wrote the {edition} edition's pages to {index.parent}: open {index}")
    return 0


def run_site(args) -> int:
    from minivtc.course.render import site

    index = site(args.out, args.lessons, args.only)
    print(f"wrote the course's site to {index.parent}: open {index}")
    return 0
