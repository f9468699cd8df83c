"""The grep for answers: every assignment function's reference body, and where it shows.

Shared by tests/test_course.py (the student edition and its rendered pages) and
tests/test_lessons.py (what every lesson prints when run with the reference package).
"""

from __future__ import annotations

from minivtc.course.assignments import ASSIGNMENTS


def reference_bodies() -> tuple[dict[str, list[str]], set[str]]:
    """Every assignment function's reference body (and the capstone answer's), read from the
    package with `ast`: its lines of code, stripped, without the docstring, blank lines,
    comments and asserts (a caller's contract, whose messages other functions share); and the
    asserts' lines, which `leaked` skips in the text it searches."""
    import ast

    from minivtc.course.edition import PACKAGE
    from minivtc.course.surgery import find, is_docstring

    bodies, asserted = {}, set()
    for a in ASSIGNMENTS:
        for file, qualname in a.reference_functions:
            source = (PACKAGE / file).read_text()
            node = find(ast.parse(source), qualname)
            body = node.body[1:] if is_docstring(node.body[0]) else node.body
            asserts = {
                n
                for check in ast.walk(node)
                if isinstance(check, ast.Assert)
                for n in range(check.lineno, (check.end_lineno or check.lineno) + 1)
            }
            numbered = list(enumerate(source.splitlines(), start=1))
            lines = [x for n, x in numbered if body[0].lineno <= n <= (node.end_lineno or 0)]
            asserted |= set(code_lines("\n".join(x for n, x in numbered if n in asserts)))
            kept = [x for x in code_lines("\n".join(lines)) if x not in asserted]
            bodies[f"{a.key}: {qualname}"] = kept
    return bodies, asserted


def code_lines(text: str) -> list[str]:
    stripped = (line.split("  #")[0].strip() for line in text.splitlines())
    return [line for line in stripped if line and not line.startswith("#")]


def leaked(reference: tuple[dict[str, list[str]], set[str]], text: str) -> list[str]:
    """The bodies found in `text`: any three consecutive lines of one (all of a shorter one),
    consecutive there too (asserts' lines skipped)."""
    bodies, asserted = reference
    joined = "\n" + "\n".join(x for x in code_lines(text) if x not in asserted) + "\n"
    found = []
    for name, lines in bodies.items():
        n = min(3, len(lines))
        windows = ("\n" + "\n".join(lines[i : i + n]) + "\n" for i in range(len(lines) - n + 1))
        if any(w in joined for w in windows):
            found.append(name)
    return found


def page_text(page: str) -> str:
    import html
    import re

    return html.unescape(re.sub(r"<[^>]+>", "", page))  # the code as a reader sees it
