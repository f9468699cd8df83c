"""Every file the package's prose names exists: a docstring, a comment, a folder README or a
lesson page that sends a reader to `sim.py` after it became `sim/simulator.py` sends them nowhere.

The rule: a backticked name ending in `.py` is a path, relative to any folder (`simulator.py`,
`sim/simulator.py`, `tests/test_sim.py`); it names a file of the repository whose path ends with
it. `*` and a `<placeholder>` stand for any part of a name (`tests/test_vllm_*.py`), and at
least one file must match. Files of other projects and files that only a build writes are named
on purpose; they are listed in `ELSEWHERE`, each with where it lives.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "minivtc"

ELSEWHERE = {
    "fair_bench/trace.py",  # the official artifact's workload generator (sim/workloads.py)
    "staff_code.py",  # written into a student edition by `minivtc course release`
    "minivtc/course/staff_code.py",  # the same, by its path in the edition
}

NAMED = re.compile(r"`([^`\s]+\.py)`")


def repository_files() -> list[str]:
    """Every file's path from the repository's root, without hidden folders and caches."""
    return [
        p.relative_to(ROOT).as_posix()
        for p in ROOT.rglob("*")
        if p.is_file()
        and not any(
            part.startswith(".") or part == "__pycache__" for part in p.relative_to(ROOT).parts
        )
    ]


def prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of what a reader reads in `path`: a page whole; of a module, its docstrings
    (the module's, each class's and each function's) and its comments."""
    source = path.read_text()
    if path.suffix == ".md":
        return [(1, source)]
    found = [
        (node.body[0].lineno, ast.get_docstring(node, clean=False) or "")
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and ast.get_docstring(node) is not None
    ]
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return found + [(t.start[0], t.string) for t in tokens if t.type == tokenize.COMMENT]


def pattern(name: str) -> re.Pattern[str]:
    """`name` as a path's ending: `*` and `<...>` match any part of one folder's or file's name."""
    parts = re.split(r"(\*|<[^>/]*>)", name.removeprefix("./"))
    body = "".join("[^/]*" if p == "*" or p.startswith("<") else re.escape(p) for p in parts)
    return re.compile(f"(.*/)?{body}")


def named_files() -> list[tuple[str, str]]:
    """(where, name) of every backticked `.py` name in the package's modules and READMEs and in
    the lessons' pages."""
    pages = [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("README.md"), *(ROOT / "lessons").glob("*.md")]
    return [
        (f"{page.relative_to(ROOT)}:{line + text[: m.start()].count(chr(10))}", m.group(1))
        for page in sorted(pages)
        if "__pycache__" not in page.parts
        for line, text in prose(page)
        for m in NAMED.finditer(text)
    ]


def test_the_name_rule_reads_paths_from_any_folder_and_patterns():
    files = ["minivtc/sim/simulator.py", "tests/test_vllm_offline.py"]
    found = lambda name: any(pattern(name).fullmatch(f) for f in files)
    assert found("simulator.py") and found("sim/simulator.py") and found("minivtc/sim/simulator.py")
    assert found("tests/test_vllm_*.py") and found("tests/test_<key>.py")
    assert not found("sim.py") and not found("imulator.py") and not found("fleet/simulator.py")


def test_every_file_the_package_s_prose_names_exists():
    files = repository_files()
    missing = [
        f"{where}: `{name}`"
        for where, name in named_files()
        if name not in ELSEWHERE and not any(pattern(name).fullmatch(f) for f in files)
    ]
    assert not missing, "names of files that do not exist:\n" + "\n".join(missing)


def test_the_prose_is_read_where_a_reader_reads_it(tmp_path):
    """Names are read in a module's docstring, a class's and a function's, and its comments; a
    string that is no docstring is no prose, and the package's own docstrings are read."""
    module = tmp_path / "probe.py"
    module.write_text('"""`a.py`"""\nclass C:\n    """`b.py`"""\n    x = "`c.py`"  # `d.py`\n')
    assert [(line, NAMED.findall(text)) for line, text in prose(module)] == [
        (1, ["a.py"]),
        (3, ["b.py"]),
        (4, ["d.py"]),
    ]
    named = {name for where, name in named_files() if where.startswith("minivtc/engine/engine.py")}
    assert "scheduler.py" in named
