"""What the server reports (`observability.py`): the fairness view, and the Prometheus text read
back by Prometheus' own parser. Snapshots are made by hand: no engine, no server."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from minivtc.fairness.cost import W_P, W_Q
from minivtc.serving.observability import fairness_view, prometheus_text
from minivtc.serving.server_stats import OTHER, ClientRow, Snapshot

PER_CLIENT = {  # family -> the row field it sums
    "minivtc_client_input_tokens": "input_tokens",
    "minivtc_client_output_tokens": "output_tokens",
    "minivtc_client_service": "service",
    "minivtc_requests_waiting": "waiting",
    "minivtc_requests_running": "running",
}


def snapshot(
    clients: dict[str, ClientRow], forgotten: ClientRow | None = None, finished: dict | None = None
) -> Snapshot:
    return Snapshot(
        "vtc",
        clients,
        used_blocks=3,
        total_blocks=10,
        block_size=16,
        finished=finished or {},
        ttft=[("0.5", 1), ("+Inf", 2)],
        ttft_sum=1.25,
        latency=[("0.5", 0), ("+Inf", 2)],
        latency_sum=4.0,
        forgotten=forgotten or ClientRow(),
    )


def parse(snap: Snapshot, top: int) -> dict[str, dict[tuple, float]]:
    """family -> {label values: value}, as a Prometheus server would read the scrape."""
    text = prometheus_text(snap, top).decode()
    return {
        f.name: {tuple(s.labels.values()): s.value for s in f.samples}
        for f in text_string_to_metric_families(text)
    }


SNAP = snapshot(
    {
        "bob": ClientRow(12.0, 1.0, waiting=0, running=1, input_tokens=4, output_tokens=3),
        "alice": ClientRow(10.0, 2.0, waiting=2, running=0, input_tokens=10, output_tokens=5),
    }
)


def test_the_fairness_view_shows_every_client_sorted():
    view = fairness_view(SNAP)
    assert view["scheduler"] == "vtc"
    assert view["kv"] == {"used_blocks": 3, "total_blocks": 10, "block_size": 16}
    assert list(view["clients"]) == ["alice", "bob"]
    assert view["clients"]["alice"] == {
        "counter": 10.0,
        "weight": 2.0,
        "waiting": 2,
        "running": 0,
        "input_tokens": 10,
        "output_tokens": 5,
        "service": W_P * 10 + W_Q * 5,
        "blocks": 0,
    }


def test_the_fairness_view_of_one_client_shows_only_its_own_numbers():
    """Its own row (with the blocks it holds), and of the pool only its configuration: the
    pool's use revealed other tenants' prompt sizes."""
    assert list(fairness_view(SNAP, only="bob")["clients"]) == ["bob"]
    assert fairness_view(SNAP, only="nobody")["clients"] == {}
    assert fairness_view(SNAP, only="bob")["kv"] == {"total_blocks": 10, "block_size": 16}


rows = st.builds(
    ClientRow,
    st.one_of(st.none(), st.floats(0, 1e6)),
    st.just(1.0),
    st.integers(0, 5),
    st.integers(0, 5),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
)
names = st.text(min_size=1, max_size=6).filter(lambda n: n != OTHER)


@given(
    st.dictionaries(names, rows, max_size=12),
    st.integers(0, 14),
    st.builds(ClientRow, input_tokens=st.integers(0, 100), output_tokens=st.integers(0, 100)),
    st.sets(st.sampled_from(["length", "eos", "abort"]), min_size=1),
)
def test_prometheus_labels_the_top_clients_and_sums_the_rest_as_other(
    clients, top, forgotten, reasons
):
    finished = {(c, r): i + 1 for i, c in enumerate(clients) for r in reasons}
    finished |= {(OTHER, "length"): 7}  # forgotten clients' requests, as the loop keeps them
    snap = snapshot(clients, forgotten, finished)
    scrape = parse(snap, top)
    ranked = sorted(clients, key=lambda c: (-clients[c].service, c))
    named, rest = ranked[:top], ranked[top:]
    has_other = bool(rest) or forgotten.input_tokens + forgotten.output_tokens > 0
    for family, field in PER_CLIENT.items():
        series = scrape[family]
        assert set(series) == {(c,) for c in named} | ({(OTHER,)} if has_other else set())
        for c in named:
            assert series[(c,)] == getattr(clients[c], field)
        # nothing lost: the labelled series add up to every client's total plus the forgotten
        total = sum(getattr(row, field) for row in [*clients.values(), forgotten])
        assert sum(series.values()) == total
    counters = scrape["minivtc_client_counter"]
    assert counters == {(c,): clients[c].counter for c in named if clients[c].counter is not None}
    assert sum(scrape["minivtc_requests_finished"].values()) == sum(finished.values())
    assert {c for c, _ in scrape["minivtc_requests_finished"]} <= {*named, OTHER}


def test_histograms_and_the_pool_are_scraped_as_they_are():
    text = prometheus_text(SNAP).decode()
    samples = {
        (s.name, s.labels.get("le")): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    for name, snap_buckets, total in (
        ("minivtc_time_to_first_token_seconds", SNAP.ttft, SNAP.ttft_sum),
        ("minivtc_request_latency_seconds", SNAP.latency, SNAP.latency_sum),
    ):
        for le, n in snap_buckets:
            assert samples[(f"{name}_bucket", le)] == n
        assert samples[(f"{name}_count", None)] == snap_buckets[-1][1]
        assert samples[(f"{name}_sum", None)] == total
    assert samples[("minivtc_kv_blocks_used", None)] == 3.0
    assert samples[("minivtc_kv_blocks_total", None)] == 10.0
    swapping = prometheus_text(dataclasses.replace(SNAP, host_tokens=40, swap_tokens=160))
    samples = {
        s.name: s.value
        for f in text_string_to_metric_families(swapping.decode())
        for s in f.samples
    }
    assert samples["minivtc_swap_tokens_used"] == 40 and samples["minivtc_swap_tokens_total"] == 160


def test_any_client_id_survives_the_exposition_format():
    """prometheus_client escapes label values: quotes, backslashes, newlines, any Unicode."""
    weird = ['say "hi"', "back\\slash", "new\nline", "ünïcødé ☃", "}{,="]
    snap = snapshot({n: ClientRow(1.0, 1.0, 0, 0, i + 1, 0) for i, n in enumerate(weird)})
    series = parse(snap, top=50)["minivtc_client_input_tokens"]
    assert series == {(n,): float(i + 1) for i, n in enumerate(weird)}


def test_a_client_named_other_loses_no_tokens():
    clients = {OTHER: ClientRow(input_tokens=100), "a": ClientRow(input_tokens=5)}
    snap = snapshot(clients, forgotten=ClientRow(input_tokens=1))
    assert sum(parse(snap, top=50)["minivtc_client_input_tokens"].values()) == 106
