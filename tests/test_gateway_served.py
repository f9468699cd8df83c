"""Which gateway served what (`shared_store.Served`) as a user sees it: `/fairness`' `served`
(a tenant sees its own rows), `/metrics` with a `gateway` label, at two gateways sharing a
Redis store and at one alone (its own numbers under its own id). The dashboard's table is
`tests/test_dashboard_browser.py`'s; the rows in the store are `tests/test_fleet_store.py`'s."""

from __future__ import annotations

import time

import httpx
import pytest

from minivtc.fleet.redis_store import RedisStore, parse_store_url
from minivtc.serving.hosting import BackgroundServer
from tests.test_gateway_store import ADMIN, CHUNKS, complete, gateway_app, standin


@pytest.fixture
def store(redis_url):
    return RedisStore(parse_store_url(redis_url), f"served-{time.monotonic_ns()}", lease_s=1.0)


def test_each_gateway_reports_what_it_served_under_its_id(store):
    """`served` in /fairness (a tenant sees its own rows), `/metrics` with a `gateway` label;
    without a store, a gateway's own numbers under its own id."""
    with BackgroundServer(standin()) as b:
        fleet = [gateway_app([b], store), gateway_app([b], store), gateway_app([b], None)]
        ids = [gateway.gateway_id for _, gateway in fleet]
        with BackgroundServer(fleet[0][0]) as u1, BackgroundServer(fleet[1][0]) as u2:
            with BackgroundServer(fleet[2][0]) as alone:
                calls = [(u1, "sk-w4-tenant"), (u2, "sk-w1-tenant"), (alone, "sk-w1-tenant")]
                for url, key in [*calls, (u2, "sk-w1-tenant")]:
                    assert complete(url, key) == CHUNKS
                time.sleep(0.2)  # (a few syncs)
                shared = httpx.get(u1 + "/fairness", headers=ADMIN).json()["served"]
                tenant = {"authorization": "Bearer sk-w1-tenant"}
                own = httpx.get(u1 + "/fairness", headers=tenant).json()["served"]
                scraped = httpx.get(u1 + "/metrics", headers=ADMIN).text
                single = httpx.get(alone + "/fairness", headers=ADMIN).json()
    one = {"requests": 1, "input_tokens": 4, "output_tokens": CHUNKS}
    two = {"requests": 2, "input_tokens": 8, "output_tokens": 2 * CHUNKS}
    assert shared == {ids[0]: {"w4": one}, ids[1]: {"w1": two}}
    assert own == {ids[0]: {}, ids[1]: {"w1": two}}  # (not w4's)
    for name, client, gateway, value in [
        ("output_tokens", "w1", 1, 2 * CHUNKS),
        ("requests", "w4", 0, 1),
    ]:
        line = f'minivtc_gateway_served_{name}_total{{client="{client}",gateway="{ids[gateway]}"}}'
        assert f"{line} {float(value)}" in scraped
    assert single["gateway"] == ids[2] and single["served"] == {ids[2]: {"w1": one}}
