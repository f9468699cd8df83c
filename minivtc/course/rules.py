"""The rules a submission keeps, applied the same way by `course grade` and `course test`.

Owns `out_of_reach` (the reference policies a capstone may not lean on, and the placeholder
each is replaced by while the capstone is graded or tested) and `refusals` (the imports that
get a capstone refused, by name). The other rule, that only an assignment's named functions and
the helpers a student adds are taken (a change to the reference's `__init__` or to another of
its functions is not), is `helpers.py`'s; `grade.take_submission` applies both, in the
reference package (`course grade`) and in a copy of the student's own edition (`course test`),
so a student meets each rule, by name, before the instructor does.
"""

from __future__ import annotations

import ast
from pathlib import Path

from minivtc.course.edition import placeholder

__all__ = ["REFERENCE_POLICIES", "out_of_reach", "put_out_of_reach", "refusals"]

# The reference policies (VTC and its family, DRR, the official artifact's): file -> the names
# it defines that a capstone could lean on. While a6 is graded or tested each is replaced by a
# placeholder whose classes refuse to be built, so a capstone cannot use them even indirectly
# (through `make_scheduler`, say).
REFERENCE_POLICIES = {
    "fairness/vtc.py": ("VTC", "FairLift"),
    "fairness/artifact.py": ("ArtifactVTC",),
    "fairness/drr.py": ("DRR",),
}
# What a capstone may not import: the policies' modules, the module that builds them by name,
# and the names themselves from anywhere.
REFUSED_MODULES = {
    f"minivtc.{f.removesuffix('.py').replace('/', '.')}" for f in REFERENCE_POLICIES
} | {"minivtc.fairness.policies"}
REFUSED_NAMES = {n for names in REFERENCE_POLICIES.values() for n in names} | {
    "make_scheduler",
    "make_vtc",
    "import_module",
    "__import__",
}


def refusals(source: str, allowed: tuple[str, ...] = ()) -> list[str]:
    """Why the capstone `source` is refused: each import of a reference policy, by name
    (`allowed`: files under minivtc/ that are the submission's own, the grader's check)."""
    allowed_modules = {f"minivtc.{f.removesuffix('.py').replace('/', '.')}" for f in allowed}
    refused = REFUSED_MODULES - allowed_modules
    allowed_names = {n for f in allowed for n in REFERENCE_POLICIES.get(f, ())}
    names = REFUSED_NAMES - allowed_names
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name in refused]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            taken = [
                a.name
                for a in node.names
                if module in refused or a.name in names or f"{module}.{a.name}" in refused
            ]
            found += [f"from {module} import {n}" for n in taken]
        elif isinstance(node, ast.Name) and node.id in names and node.id.startswith("__"):
            found.append(node.id)
        elif isinstance(node, ast.Attribute) and node.attr in names:
            found.append(f"{ast.unparse(node)}")
    return [
        f"refused: your capstone uses {what}, a reference policy (or a way to reach one): "
        "write your own policy, through the Scheduler interface only"
        for what in dict.fromkeys(found)
    ]


def put_out_of_reach(a, package: Path) -> None:
    """While the own-file assignment `a` is graded or tested, in the copy of the package at
    `package`: each reference policy's file becomes a placeholder (its answer's, DRR, the
    edition's own), and an answer kept in `course/instructor/` (the design assignments') a
    module that refuses to be imported, where that folder is there at all (not in the
    edition)."""
    answers = {f for f, _ in a.answer}
    for file in REFERENCE_POLICIES:
        text = placeholder(a.key) if file in answers else out_of_reach(a.key, file)
        (package / file).write_text(text)
    for file in sorted(answers - set(REFERENCE_POLICIES)):
        if (package / file).parent.is_dir():
            (package / file).write_text(HIDDEN_ANSWER.format(key=a.key, own=a.own_file))


HIDDEN_ANSWER = """\"\"\"The instructor's answer to {key}: out of reach while {key} is graded.\"\"\"

raise ImportError("the instructor's answer to {key} is out of reach: write your own policy in "
                  "minivtc/{own}")
"""


def out_of_reach(key: str, file: str) -> str:
    """The placeholder for the reference policy file `file` while `key` is graded: its classes
    are there, refusing to be built, so that what imports them still imports."""
    classes = "\n\n".join(
        f"class {name}(Scheduler):\n"
        "    def __init__(self, *args: object, **kwargs: object) -> None:\n"
        f"        raise NotImplementedError({MESSAGE.format(name=name, key=key)!r})\n"
        for name in REFERENCE_POLICIES[file]
    )
    return (
        f'"""A reference policy, out of reach while {key} is graded: write your own."""\n\n'
        "from __future__ import annotations\n\n"
        "from minivtc.fairness.scheduler import Scheduler\n\n\n"
        f"{classes}"
    )


MESSAGE = (
    "{name} is a reference policy, out of reach in the capstone ({key}): write your own policy "
    "in minivtc/course/capstone.py"
)
