"""The staff's compiled answers: what lets every lesson run in the student edition in its own
week, whatever the student has written so far.

In the student edition each assignment's function keeps the student's stub (its docstring,
then `raise NotImplementedError`, which the student replaces) and the edition also carries the
staff's answer to it, compiled: the reference function's code object, marshalled
(`staff_code.py`, written by `minivtc course release`; never its source, nor its line
numbers), as courses ship a compiled staff solution. A lesson or problem set of the edition
opens with `staff.use()`, which puts that code into the package's functions for the lesson's
own process, so the lesson runs on the staff's answers. It refuses to run where graded tests
run (pytest, the grading channel's worker), so a submission that calls it gains nothing in
`course test`; in grading it is the reference package's, which changes nothing. `minivtc course
test KEY` runs the staff's answers too, for every assignment but KEY (`load`, called by the
test runner's side before the student's code is imported: `staffed.py`, the worker), as
grading runs the reference's: KEY's functions stay the student's, whatever the rest holds.

Marshal's format belongs to one Python minor version (and one implementation, CPython): the
edition says which it was built with, and `use()` refuses any other with a message naming
both. A determined student can disassemble the code objects (`dis`), as with any staff
binary; the edition says so in its README. In the reference package (the instructor's edition)
the package's own functions are the staff's, so `use()` changes nothing.

Owns `compiled` and `staff_module` (release's side: the code objects of the reference's
functions, marshalled, and the module that carries them), `use` (the lesson's side) and `load`
(`course test`'s). Does not own the stubs (`surgery.stub`) or the edition (`edition.py`).
"""

from __future__ import annotations

import base64
import importlib
import marshal
import sys
import types
from collections.abc import Collection
from pathlib import Path

from minivtc.course import STUDENT_EDITION

__all__ = ["load", "staff_module", "use"]

# What a marshalled code object is tied to: CPython's bytecode of one minor version
TAG = sys.implementation.cache_tag  # e.g. "cpython-311"


def compiled(package: Path, functions: list[tuple[str, str]]) -> dict[str, str]:
    """`functions` ((file under minivtc/, qualified name)) of the reference package at
    `package`, each compiled and marshalled, base64: "file:qualname" -> its code. Each code
    object's file name says whose it is, so a traceback through it shows no source line."""
    out = {}
    for file, qualname in functions:
        source = (package / file).read_text()
        module = compile(source, f"minivtc/{file}", "exec", dont_inherit=True)
        code = find_code(module, qualname)
        out[f"{file}:{qualname}"] = base64.b64encode(
            marshal.dumps(renamed(code, f"<the staff's compiled minivtc/{file}>"))
        ).decode()
    return out


def staff_module(package: Path, functions: list[tuple[str, str]]) -> str:
    """The edition's `minivtc/course/staff_code.py`: each of `functions`' reference code,
    compiled and marshalled (never its source), base64 in lines of 88 characters."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    entries = "".join(
        f"    {key!r}: (\n{wrapped(data)}    ),\n"
        for key, data in compiled(package, functions).items()
    )
    return f'''"""The staff's compiled answers to the assignments, for `staff.use()` (the lessons
run them): each function's code object, marshalled and base64-encoded, compiled by {TAG}
(Python {python}); marshal's format is that minor version's alone, so `staff.use()` refuses
any other Python. Written by `minivtc course release`. A determined student can disassemble
it, as any staff binary; grading never runs it."""

TAG = {TAG!r}
PYTHON = {python!r}
CODE = {{
{entries}}}
'''


def wrapped(data: str, width: int = 88) -> str:
    return "".join(f"        {data[i : i + width]!r}\n" for i in range(0, len(data), width))


def find_code(code: types.CodeType, qualname: str) -> types.CodeType:
    """The code object of the function `qualname` defined in `code` (a module's): each part of
    the name is a class body's or a function's code among the constants of the one before."""
    first, _, rest = qualname.partition(".")
    for const in code.co_consts:
        if isinstance(const, types.CodeType) and const.co_name == first:
            return find_code(const, rest) if rest else const
    raise LookupError(f"no function {qualname} in {code.co_filename}")


def renamed(code: types.CodeType, filename: str) -> types.CodeType:
    """`code` with no line of the reference's source: every instruction on the function's first
    line (CPython's location table, one "no columns" entry per 8 code units, line delta 0), so
    that where `use` puts it, a traceback points at the student's `def` line, not at lines of
    the student's file that the reference's numbers would name."""
    consts = tuple(
        renamed(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts
    )
    units, table = len(code.co_code) // 2, bytearray()
    while units:
        run = min(8, units)
        table += bytes((0x80 | 13 << 3 | (run - 1), 0))
        units -= run
    return code.replace(co_filename=filename, co_consts=consts, co_linetable=bytes(table))


def placed(code: types.CodeType, function: types.FunctionType) -> types.CodeType:
    """`code` as if written where `function` (the stub) is: its file and first line, so
    `inspect.getsource` (the lessons' `show`) reads the stub the student sees and edits."""
    first, filename = function.__code__.co_firstlineno, function.__code__.co_filename
    consts = tuple(
        placed(c, function) if isinstance(c, types.CodeType) else c for c in code.co_consts
    )
    return code.replace(co_filename=filename, co_firstlineno=first, co_consts=consts)


def use() -> int:
    """Run the staff's answers in this process: each assignment function of the package gets
    its staff code. Returns how many functions it set (0 in the reference package, whose
    functions are the staff's already). Raises RuntimeError on a Python other than the one the
    edition was built with."""
    if not STUDENT_EDITION:
        return 0
    if "pytest" in sys.modules or "minivtc.course.channel" in sys.modules:
        raise RuntimeError(
            "staff.use() is for the lessons: `minivtc course test` runs your own code for the "
            "assignment it tests (the staff's for the others, as grading runs the reference's)"
        )
    return load(())


def load(keep: Collection[str]) -> int:
    """Each assignment function of the package but those in `keep` ("file:qualname", the
    student's own) gets its staff code; how many it set. `use`'s, and `course test`'s, whose
    runner names the assignment under test's functions in `keep` before any of the student's
    code runs. Nothing outside the student edition (the reference's functions are the staff's)."""
    if not STUDENT_EDITION:
        return 0
    from minivtc.course import staff_code  # type: ignore[attr-defined]  # the edition's alone

    if staff_code.TAG != TAG:
        raise RuntimeError(
            f"this student edition's staff code was compiled for {staff_code.TAG} "
            f"(Python {staff_code.PYTHON}); this is {TAG} (Python {sys.version.split()[0]}). "
            f"Marshalled code runs only on the Python minor version that wrote it: run the "
            f"lessons with Python {staff_code.PYTHON}, or ask for an edition built with yours"
        )
    chosen = {k: v for k, v in staff_code.CODE.items() if k not in keep}
    for key, data in chosen.items():
        file, _, qualname = key.partition(":")
        put(file, qualname, marshal.loads(base64.b64decode(data)))
    return len(chosen)


def put(file: str, qualname: str, code: types.CodeType) -> None:
    """Make the package's function `qualname` of `file` run `code`. Its code is swapped in
    place when the two agree on their free variables, so every name bound to the function
    (`from ... import f`) runs the staff's; a method whose staff code reads `__class__`
    (`super()`) where the stub does not is replaced on its class by a function closing over
    that class."""
    owner: object = importlib.import_module("minivtc." + file.removesuffix(".py").replace("/", "."))
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    function = getattr(owner, name)
    code = placed(code, function)
    if function.__code__.co_freevars == code.co_freevars:
        function.__code__ = code
        return
    if code.co_freevars != ("__class__",):
        raise ValueError(f"{qualname}: the staff's code closes over {code.co_freevars}")
    cells = (types.CellType(owner),)
    staff = types.FunctionType(code, function.__globals__, name, function.__defaults__, cells)
    staff.__kwdefaults__ = function.__kwdefaults__
    staff.__qualname__, staff.__doc__ = function.__qualname__, function.__doc__
    staff.__annotations__ = function.__annotations__
    setattr(owner, name, staff)
