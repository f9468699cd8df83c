"""Every policy by its command-line name (`make_scheduler`): the right class, predictor and cost."""

from __future__ import annotations

import pytest

from minivtc.core.cost import ProfiledCost
from minivtc.core.policies import make_scheduler
from minivtc.core.predictors import MeanOfLast
from tests.test_vtc import finished


def test_make_scheduler_names():
    names = ["fcfs", "rpm:5", "lcf", "vtc", "vtc-artifact", "vtc-predict", "vtc-predict-ema",
             "vtc-oracle", "vtc-oracle:0.5", "vtc-profile", "vtc-oracle-profile",
             "lcf-profile"]  # fmt: skip
    for name in names:
        assert make_scheduler(name).name == name
    with pytest.raises(ValueError, match="unknown scheduler 'vtc2'; choose one of"):
        make_scheduler("vtc2")


def test_profile_suffix_charges_the_profiled_cost():
    vtc = make_scheduler("vtc-predict-profile")
    assert isinstance(vtc.cost, ProfiledCost) and isinstance(vtc.predictor, MeanOfLast)
    finished(vtc, "a", 100, 50)
    assert vtc.counters["a"] == pytest.approx(ProfiledCost()(100, 50))
