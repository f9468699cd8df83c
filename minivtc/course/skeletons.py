"""What the student edition holds of each file a student writes whole: its class, empty.

The capstone (a6, `capstone.py`: `FairPolicy`) and the design assignments (d1 and d2,
`design/quota.py` and `design/tenants.py`) are each one file, written whole by the student.
`edition.release` writes each as its docstring (the task) followed by its skeleton here, every
method raising NotImplementedError; the instructors' answers (DRR, `course/instructor/`) are
not in the edition. Does not own the release (`edition.py`).
"""

from __future__ import annotations

__all__ = ["SKELETONS"]

HEAD = """
from __future__ import annotations

from collections.abc import Iterator

from minivtc.fairness.cost import PAPER_COST, Cost
from minivtc.fairness.scheduler import Scheduler
from minivtc.requests.request import Request

"""
METHODS = """
    def add(self, request: Request, now: float) -> str | None:
        raise NotImplementedError(MESSAGE)

    def peek(self) -> Request | None:
        raise NotImplementedError(MESSAGE)

    def dispatch(self, request: Request) -> None:
        raise NotImplementedError(MESSAGE)

    def on_decode(self, requests: list[Request]) -> None:
        raise NotImplementedError(MESSAGE)

    def on_finish(self, request: Request) -> None:
        raise NotImplementedError(MESSAGE)

    def remove(self, request: Request) -> None:
        raise NotImplementedError(MESSAGE)

    def requeue(self, request: Request) -> None:
        raise NotImplementedError(MESSAGE)

    def waiting(self) -> Iterator[Request]:
        raise NotImplementedError(MESSAGE)

    def gap_bound(self, u: float) -> float | None:
        raise NotImplementedError(MESSAGE)
"""
FAIR = '''
class FairPolicy(Scheduler):
    """Your fair policy (the module docstring says what it must do)."""

    BOUND = ""  # your bound in words, with the argument for it

    def __init__(self, cost: Cost = PAPER_COST) -> None:
        self.cost = cost  # what service is priced by: the bound's w_p and w_q
        self.name = "fair"
'''
QUOTA = '''
class QuotaPolicy(Scheduler):
    """Your policy (the module docstring says what it must do)."""

    BOUND = ""  # your bound in words, with the argument for it

    def __init__(self, quotas: dict[str, int] | None = None, cost: Cost = PAPER_COST) -> None:
        self.quotas = dict(quotas or {})  # client -> the most tokens it may hold at once
        self.cost = cost  # what service is priced by: the bound's w_p and w_q
        self.name = "quota"
'''
TENANTS = '''
class TenantPolicy(Scheduler):
    """Your policy (the module docstring says what it must do)."""

    BOUND = ""  # both bounds in words, with the argument for them

    def __init__(self, cost: Cost = PAPER_COST) -> None:
        self.cost = cost  # what service is priced by: the bound's w_p and w_q
        self.name = "tenants"
'''
USER_BOUND = """
    def user_gap_bound(self, u: float) -> float | None:
        raise NotImplementedError(MESSAGE)
"""
# an own file (under minivtc/) -> the skeleton the edition writes after its docstring
SKELETONS = {
    "course/capstone.py": HEAD + FAIR + METHODS,
    "course/design/quota.py": HEAD + QUOTA + METHODS,
    "course/design/tenants.py": HEAD + TENANTS + METHODS + USER_BOUND,
}
