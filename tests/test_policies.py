"""Every policy by its command-line name (`make_scheduler`): the right class, predictor and cost.

The table below is checked against `SCHEDULERS`, the list the command line's help prints, so a
name added there without a row here fails."""

from __future__ import annotations

import re

import pytest

from minivtc.engine.sampler import SamplingParams
from minivtc.fairness.artifact import ArtifactVTC
from minivtc.fairness.cost import LinearCost, ProfiledCost
from minivtc.fairness.policies import SCHEDULERS, make_scheduler
from minivtc.fairness.predictors import MeanOfLast, MovingAverage, Oracle
from minivtc.fairness.scheduler import FCFS, RPM
from minivtc.fairness.vtc import VTC
from minivtc.requests.request import Request
from tests.test_vtc import finished

# name (N and P as SCHEDULERS writes them) -> (class, lift, predictor class, oracle spread)
VTC_FAMILY = {
    "lcf": (VTC, False, None, None),
    "vtc": (VTC, True, None, None),
    "vtc-artifact": (ArtifactVTC, True, None, None),
    "vtc-predict": (VTC, True, MeanOfLast, None),
    "vtc-predict-ema": (VTC, True, MovingAverage, None),
    "vtc-oracle": (VTC, True, Oracle, 0.0),
    "vtc-oracle:P": (VTC, True, Oracle, 0.5),
}
EXAMPLE = {"N": "5", "P": "0.5"}


def listed_names() -> list[str]:
    """The names SCHEDULERS lists before "and any of the VTC family with -profile"."""
    listed, _, rest = SCHEDULERS.partition(", and any of the VTC family with -profile")
    assert rest, f"SCHEDULERS no longer mentions -profile: {SCHEDULERS!r}"
    return [n.strip() for n in listed.split(",")]


def concrete(name: str) -> str:
    return re.sub(r"(?<=:)[NP]$", lambda m: EXAMPLE[m.group()], name)


def test_the_table_covers_every_listed_name():
    assert set(listed_names()) == {"fcfs", "rpm:N", "drr", "drr:Q", *VTC_FAMILY}


def test_drr_builds_with_its_quantum_and_refuses_a_bad_one():
    from minivtc.fairness.drr import DRR

    assert type(make_scheduler("drr")) is DRR and make_scheduler("drr").quantum == 256
    drr = make_scheduler("drr:32", artifact=True)  # (the artifact's quirks are VTC's only)
    assert type(drr) is DRR and drr.quantum == 32 and drr.name == "drr:32"
    with pytest.raises(ValueError, match="quantum must be > 0"):
        make_scheduler("drr:0")
    with pytest.raises(ValueError, match="choose one of"):
        make_scheduler("drr:x")


def test_fcfs_and_rpm_build_and_ignore_the_vtc_options():
    for artifact in (False, True):
        fcfs = make_scheduler("fcfs", weights={"a": 2.0}, artifact=artifact)
        rpm = make_scheduler("rpm:5", weights={"a": 2.0}, artifact=artifact)
        assert type(fcfs) is FCFS and fcfs.name == "fcfs"
        assert type(rpm) is RPM and rpm.limit == 5 and rpm.name == "rpm:5"


@pytest.mark.parametrize("profile", [False, True], ids=["linear", "profile"])
@pytest.mark.parametrize("listed", list(VTC_FAMILY))
def test_every_vtc_family_name_builds_its_class_predictor_and_cost(listed, profile):
    kind, lift, predictor, spread = VTC_FAMILY[listed]
    name = concrete(listed) + ("-profile" if profile else "")
    vtc = make_scheduler(name)
    assert type(vtc) is kind and vtc.name == name and vtc.lift is lift
    assert type(vtc.predictor) is (predictor or type(None))
    if spread is not None:
        assert vtc.predictor.spread == spread
    assert vtc.cost == (ProfiledCost() if profile else LinearCost())


@pytest.mark.parametrize("listed", list(VTC_FAMILY))
def test_artifact_true_makes_the_artifacts_counting_of_the_same_policy(listed):
    name = concrete(listed)
    plain, artifact = make_scheduler(name), make_scheduler(name, artifact=True)
    assert type(artifact) is ArtifactVTC and artifact.name == name
    assert artifact.lift is plain.lift and type(artifact.predictor) is type(plain.predictor)
    assert artifact.cost == plain.cost


def test_weights_and_seed_reach_the_policy():
    weights = {"a": 2.0}
    vtc = make_scheduler("vtc-predict", weights=weights)
    weights["a"] = 5.0  # the scheduler keeps its own copy
    assert vtc.weights == {"a": 2.0}

    def draws(seed: int) -> list[float]:
        oracle = make_scheduler("vtc-oracle:0.5", seed=seed).predictor
        probe = Request("p", "a", [1], SamplingParams(max_tokens=100), 0.0)
        return [oracle.predict(probe) for _ in range(5)]

    assert draws(3) == draws(3) != draws(4)


@pytest.mark.parametrize(
    "name",
    [
        "vtc2",
        "VTC",
        "",
        "rpm",
        "fcfs-profile",
        "vtc-profile-profile",
        "rpm:x",
        "vtc-oracle:x",
        "rpm:5-profile",
    ],
)
def test_an_unknown_name_is_refused_with_the_choices(name):
    with pytest.raises(ValueError, match=re.escape(f"choose one of: {SCHEDULERS}")):
        make_scheduler(name)


def test_an_rpm_limit_below_one_is_refused():
    with pytest.raises(ValueError, match="rpm limit must be >= 1, got 0"):
        make_scheduler("rpm:0")


def test_make_scheduler_names():
    names = [
        "fcfs",
        "rpm:5",
        "lcf",
        "vtc",
        "vtc-artifact",
        "vtc-predict",
        "vtc-predict-ema",
        "vtc-oracle",
        "vtc-oracle:0.5",
        "vtc-profile",
        "vtc-oracle-profile",
        "lcf-profile",
    ]
    for name in names:
        assert make_scheduler(name).name == name
    with pytest.raises(ValueError, match="unknown scheduler 'vtc2'; choose one of"):
        make_scheduler("vtc2")


def test_profile_suffix_charges_the_profiled_cost():
    vtc = make_scheduler("vtc-predict-profile")
    assert isinstance(vtc.cost, ProfiledCost) and isinstance(vtc.predictor, MeanOfLast)
    finished(vtc, "a", 100, 50)
    assert vtc.counters["a"] == pytest.approx(ProfiledCost()(100, 50))


@pytest.mark.parametrize("name", ["vtc-oracle:-1", "vtc-oracle:1.5"])
def test_an_oracle_spread_outside_0_1_is_refused(name):
    """A spread over 1 could predict a negative length."""
    with pytest.raises(ValueError, match="spread 0 <= P <= 1"):
        make_scheduler(name)
