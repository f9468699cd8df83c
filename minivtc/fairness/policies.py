"""Every policy by the name the command line and the APIs use: `make_scheduler("vtc")`.

Owns: `SCHEDULERS` (the names, for help texts) and `make_scheduler`. The policies themselves
are `scheduler.py`'s (FCFS, RPM) and `vtc.py`'s (VTC, LCF, the artifact's VTC); their predictors
`predictors.py`'s and costs `cost.py`'s.
"""

from __future__ import annotations

from minivtc.fairness.artifact import ArtifactVTC
from minivtc.fairness.cost import Cost, LinearCost, ProfiledCost
from minivtc.fairness.drr import DRR
from minivtc.fairness.predictors import MeanOfLast, MovingAverage, Oracle, Predictor
from minivtc.fairness.scheduler import FCFS, RPM, Scheduler
from minivtc.fairness.vtc import VTC

__all__ = ["SCHEDULERS", "make_scheduler"]

SCHEDULERS = (
    "fcfs, rpm:N, drr, drr:Q, lcf, vtc, vtc-artifact, vtc-predict, vtc-predict-ema, vtc-oracle, "
    "vtc-oracle:P, and any of the VTC family with -profile (e.g. vtc-profile)"
)


def make_scheduler(
    name: str,
    weights: dict[str, float] | None = None,
    seed: int = 0,
    artifact: bool = False,
    cached_weight: float | None = None,
) -> Scheduler:
    """A scheduler from its command-line name. `weights` (operator-set) apply to the VTC family;
    `artifact=True` reproduces the official artifact's counter quirks (no lift to the last
    client to leave, an uncharged first token, an extra charge on finish events; see
    lessons/artifact_deviations.md).
    A VTC-family name ending in "-profile" charges the profiled h instead of w_p n_p + w_q n_q.
    `cached_weight` w_c: the VTC family's charge for a prompt token found in the prefix cache
    (None: w_p, as any prompt token)."""
    if cached_weight is not None and not name.startswith(("vtc", "lcf")):
        raise ValueError(f"cached_weight prices service for the VTC family, not {name!r}")
    if name == "fcfs":
        return FCFS()
    if name.startswith("rpm:"):
        return RPM(int(number(name, int)))
    if name == "drr" or name.startswith("drr:"):  # Deficit Round Robin (Appendix C.2)
        return DRR(number(name, float)) if ":" in name else DRR()
    return make_vtc(name, weights, seed, artifact, cached_weight)


def make_vtc(
    name: str,
    weights: dict[str, float] | None,
    seed: int,
    artifact: bool,
    cached_weight: float | None,
) -> VTC:
    """The VTC family: vtc, lcf (no lift), the predicting variants; "-profile" for the
    profiled h; "vtc-artifact", or `artifact`, for the artifact's counting."""
    base = name.removesuffix("-profile")
    cost: Cost = ProfiledCost() if name.endswith("-profile") else LinearCost()
    if base == "vtc-artifact":  # VTC as the official artifact charges (artifact_deviations.md)
        base, artifact = "vtc", True
    kind = ArtifactVTC if artifact else VTC
    predictor = predictor_of(name, base, seed)
    return kind(
        cost=cost,
        weights=weights,
        lift=base != "lcf",
        predictor=predictor,
        name=name,
        cached_weight=cached_weight,
    )


def predictor_of(name: str, base: str, seed: int) -> Predictor | None:
    """The output-length predictor a VTC-family name asks for (Algorithm 3), or None."""
    if base in ("vtc", "lcf"):
        return None
    if base == "vtc-predict":
        return MeanOfLast()
    if base == "vtc-predict-ema":
        return MovingAverage()
    if base == "vtc-oracle" or base.startswith("vtc-oracle:"):
        spread = number(base, float) if ":" in base else 0.0
        if not 0 <= spread <= 1:  # predictions in [(1-P)L, (1+P)L]: never negative
            raise ValueError(f"vtc-oracle:P wants a spread 0 <= P <= 1, got {spread}")
        return Oracle(spread, seed)
    raise ValueError(f"unknown scheduler {name!r}; choose one of: {SCHEDULERS}")


def number(name: str, kind: type[int] | type[float]) -> float:
    """The number after the ':' of `name` (rpm:5, vtc-oracle:0.5)."""
    try:
        return kind(name.split(":", 1)[1])
    except ValueError:
        raise ValueError(f"unknown scheduler {name!r}; choose one of: {SCHEDULERS}") from None
