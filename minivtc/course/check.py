"""The grader's own check: does it tell wrong from right? (`minivtc course check-grader`)

Owns `check_catalogue` (grade every wrong solution of `wrong.py`, each on its own assignment
only: each must lose points) and `check_mutants` (grade every mutant of `mutate.py`: the share
killed, i.e. losing points, is the assignment's mutation score, and the survivors are listed
for a person to judge). Each submission goes through the real grader (`grade.grade_one`: the
splice, the scratch package, the graded tests), forked from this warm process (`warm.py`), one
at a time; `first_failure` stops each at its first failed test, which is all "loses points"
needs. Also runnable as `python -m minivtc.course.check` (what CI's test starts: a fresh
process, so that nothing has run torch work before the forks).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from minivtc.course import warm
from minivtc.course.assignments import ASSIGNMENTS, Assignment
from minivtc.course.edition import PACKAGE
from minivtc.course.edits import apply
from minivtc.course.grade import How, grade_one
from minivtc.course.mutate import Mutant, mutants
from minivtc.course.wrong import WRONG, Wrong

__all__ = ["CHECK_LIMIT_S", "answer_files", "assignment", "run", "write_edition"]

# Per submission: a6's tests take about a minute (the paper's workloads in the simulator), and
# a submission that runs them all must not be cut off and counted as losing points.
CHECK_LIMIT_S = 180


def check_catalogue(
    only: list[str] | None = None, first_failure: bool = True, jobs: int = 1
) -> list[dict]:
    """One row per wrong solution: its assignment, the mistake, its points (with
    `first_failure`, the points of the tests run until the first failure), the tests failed."""
    warm.preload()
    chosen = [wrong for wrong in WRONG if not only or wrong.key in only]

    def one(wrong: Wrong) -> dict:
        with tempfile.TemporaryDirectory(prefix="minivtc-wrong-") as scratch:
            edition = write_edition(wrong, Path(scratch))
            a = assignment(wrong.key)
            whole = answer_files(a) if wrong.own_file is None else ()  # a whole file: alone
            g = grade_one(a, edition, How(CHECK_LIMIT_S, True, first_failure, trusted=True), whole)
        return row(wrong.key, wrong.what, g)

    return warm.parallel_map(one, chosen, jobs)


def check_mutants(key: str, limit: int = 60, jobs: int = 1) -> dict:
    """The mutation score of `key`'s graded tests: killed / total, and the survivors."""
    warm.preload()
    a = assignment(key)
    found = mutants(a, limit)

    def killed(m: Mutant) -> bool:
        with tempfile.TemporaryDirectory(prefix="minivtc-mutant-") as scratch:
            edition = write_mutant(a, m, Path(scratch))
            g = grade_one(a, edition, How(CHECK_LIMIT_S, True, True, trusted=True), answer_files(a))
        return g.points < g.max_points

    dead = warm.parallel_map(killed, found, jobs)
    survivors = [f"{m.qualname} {m.change}" for m, d in zip(found, dead, strict=True) if not d]
    return {"assignment": key, "killed": sum(dead), "total": len(found), "survivors": survivors}


def answer_files(a: Assignment) -> tuple[str, ...]:
    """The instructor's answer's files (the capstone's DRR), graded beside its own file."""
    return tuple(sorted({f for f, _ in a.answer}))


def row(key: str, what: str, g) -> dict:
    failed = [f["name"] for f in g.failures] or ([g.note] if g.note else [])
    return {
        "assignment": key,
        "wrong": what,
        "points": g.points,
        "max": g.max_points,
        "failed": failed,
    }


def assignment(key: str) -> Assignment:
    (a,) = [a for a in ASSIGNMENTS if a.key == key]
    return a


def write_edition(wrong: Wrong, out: Path) -> Path:
    """A minimal edition at `out`: the reference's files of `wrong`'s assignment, its edits made."""
    a = assignment(wrong.key)
    write_own_file(a, out)
    if wrong.own_file is not None:
        write(out / "minivtc" / (a.own_file or ""), wrong.own_file)
        return out
    for file in sorted({f for f, _ in a.reference_functions} | wrong.files):
        write(out / "minivtc" / file, apply(wrong.edits, file, (PACKAGE / file).read_text()))
    return out


def write_own_file(a: Assignment, out: Path) -> None:
    """An own-file assignment's file, the reference's (it uses the answer written beside it)."""
    if a.own_file is not None:
        write(out / "minivtc" / a.own_file, (PACKAGE / a.own_file).read_text())


def write_mutant(a: Assignment, m: Mutant, out: Path) -> Path:
    for file in {f for f, _ in a.reference_functions}:
        write(out / "minivtc" / file, m.source if file == m.file else (PACKAGE / file).read_text())
    write_own_file(a, out)
    return out


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def catalogue_table(rows: list[dict]) -> str:
    lines = ["| assignment | wrong solution | points | failed first |", "| --- | --- | --- | --- |"]
    for r in rows:
        first = r["failed"][0] if r["failed"] else "(none: full marks)"
        lines.append(f"| {r['assignment']} | {r['wrong']} | {r['points']:g}/{r['max']} | {first} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="minivtc course check-grader", description=__doc__)
    p.add_argument("--only", action="append", help="check only this assignment (repeat)")
    p.add_argument("--catalogue-only", action="store_true", help="skip the mutation run")
    p.add_argument("--mutants-only", action="store_true", help="skip the catalogue")
    p.add_argument("--full", action="store_true", help="grade each wrong solution fully (points)")
    p.add_argument("--jobs", type=int, default=1, help="graded runs at once")
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args(argv)
    return run(args)


def run(args) -> int:
    results: dict = {}
    start = time.monotonic()
    if not args.mutants_only:
        rows = check_catalogue(args.only, not args.full, args.jobs)
        results["catalogue"] = rows
        print(catalogue_table(rows), flush=True)
    if not args.catalogue_only:
        results["mutants"] = []
        for a in ASSIGNMENTS:
            if args.only and a.key not in args.only:
                continue
            score = check_mutants(a.key, jobs=args.jobs)
            results["mutants"].append(score)
            print(f"{a.key}: {score['killed']}/{score['total']} mutants killed", flush=True)
            for s in score["survivors"]:
                print(f"    survived: {s}", flush=True)
    print(f"({time.monotonic() - start:.0f} s)", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    kept = [r for r in results.get("catalogue", []) if r["points"] >= r["max"]]
    return 1 if kept else 0


if __name__ == "__main__":
    sys.exit(main())
