"""`%%needs a2 a3 a4`: a lesson's cell that runs once those assignments are written.

The student edition's lessons are read before the assignments they teach are done: a cell that
drives the engine (a2's allocator, a3's step) or runs VTC (a4) would stop the lesson at the
first stub. Marked `%%needs KEYS`, it says which assignments it waits for and is skipped until
their functions are written; with the reference package (the instructor's lessons, the tests)
every assignment is written and the cell runs as it stands. A lesson loads this with
`%load_ext minivtc.course.needs` in its first code cell. An assignment is written when none of
its functions still raises the edition's `NotImplementedError("Assignment ...")`.
"""

from __future__ import annotations

import importlib
import inspect

from minivtc.course.assignments import ASSIGNMENTS


def unwritten(short: str) -> list[str]:
    """The functions of assignment `short` (a4, or a4_vtc) still left as the edition's stubs."""
    chosen = [a for a in ASSIGNMENTS if short in (a.key, a.key.split("_")[0])]
    if not chosen:
        raise ValueError(f"%%needs {short}: no such assignment ({[a.key for a in ASSIGNMENTS]})")
    (a,) = chosen
    left = []
    for file, qualname in a.functions:
        target = importlib.import_module("minivtc." + file.removesuffix(".py").replace("/", "."))
        for part in qualname.split("."):
            target = getattr(target, part)
        if f"NotImplementedError('Assignment {a.key}:" in inspect.getsource(target):
            left.append(qualname)
    return left


def needs(line: str, cell: str) -> None:
    """The cell magic: run `cell` if every assignment on `line` is written, else say why not."""
    from IPython import get_ipython

    missing = {key: left for key in line.split() if (left := unwritten(key))}
    if missing:
        what = "; ".join(f"{key}: {', '.join(left)}" for key, left in missing.items())
        print(f"(skipped: this cell runs once you have written {what})")
        return
    get_ipython().run_cell(cell).raise_error()


def load_ipython_extension(ipython) -> None:
    ipython.register_magic_function(needs, "cell")
