"""The gateway's Prometheus families (`/metrics`), made from `/fairness`'s view of the fleet
at each scrape (`app.fleet_view`): each client's counter and requests, each backend's budget,
reservation and health, the requests' outcomes, what each gateway served each client (a
`gateway` label: the fleet's rows with a store, this gateway's alone without), and with
`--store` the store's state (up or serving on this gateway's own counters), the gateways it
sees, the lag of its view and the store operations it made. README: "Fair across replicas";
minivtc/fleet/README.md.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["FleetCollector"]


class FleetCollector:
    """Prometheus families from the fleet's view (`view()`: `/fairness`'s), made at each
    scrape."""

    def __init__(self, view: Callable[[], dict]) -> None:
        self.view = view

    def collect(self):
        view = self.view()
        per_client = [
            ("minivtc_gateway_counter", "Each client's virtual token counter.", "counter"),
            ("minivtc_gateway_waiting", "Requests waiting at the gateway.", "waiting"),
            ("minivtc_gateway_running", "Requests running on backends.", "running"),
        ]
        for name, doc, key in per_client:
            family = GaugeMetricFamily(name, doc, labels=["client"])
            for client, row in view["clients"].items():
                family.add_metric([client], float(row[key] or 0.0))
            yield family
        per_backend = [
            ("minivtc_gateway_backend_budget_tokens", "A backend's token budget.", "budget"),
            ("minivtc_gateway_backend_reserved_tokens", "Tokens reserved on it.", "reserved"),
            ("minivtc_gateway_backend_healthy", "1 while it takes work.", "healthy"),
        ]
        for name, doc, key in per_backend:
            family = GaugeMetricFamily(name, doc, labels=["backend"])
            for row in view["backends"]:
                family.add_metric([row["url"]], float(row[key]))
            yield family
        requests = GaugeMetricFamily(
            "minivtc_gateway_requests", "Requests served, given back, broken.", labels=["outcome"]
        )
        for outcome, n in view["requests"].items():
            requests.add_metric([outcome], float(n))
        yield requests
        yield from served_families(view["served"])
        if view["fleet"] is not None:
            yield from store_families(view["fleet"], view["requests"])


SERVED = [
    ("minivtc_gateway_served_requests", "Requests a gateway served, per client.", "requests"),
    ("minivtc_gateway_served_input_tokens", "Their prompt tokens.", "input_tokens"),
    ("minivtc_gateway_served_output_tokens", "Their output tokens.", "output_tokens"),
]


def served_families(served: dict[str, dict[str, dict[str, int]]]):
    """Which gateway served what (`/fairness`'s `served`), labelled by gateway id and client:
    gateways x clients series, since the id is `host:port`, the same after a restart."""
    for name, doc, key in SERVED:
        family = CounterMetricFamily(name, doc, labels=["gateway", "client"])
        for gateway, rows in served.items():
            for client, row in rows.items():
                family.add_metric([gateway, client], float(row[key]))
        yield family


def store_families(fleet: dict, counts: dict[str, int]):
    """With --store: whether it answers, what this gateway sees of the fleet, what it cost."""
    served = max(counts.get("served", 0), 1)
    rows = [
        ("minivtc_gateway_store_up", "1 while the shared store answers.", fleet["store_up"]),
        ("minivtc_gateway_fleet_gateways", "Gateways with a live lease.", fleet["gateways"]),
        ("minivtc_gateway_view_lag", "Delta: the most lag seen (counter).", fleet["most_lag"]),
        ("minivtc_gateway_fleet_bound", "2U + 4 Delta; NaN: store down.", fleet["bound"]),
        ("minivtc_gateway_store_operations", "Round trips made.", fleet["store_operations"]),
        (
            "minivtc_gateway_store_operations_per_request",
            "Round trips per request served.",
            fleet["store_operations"] / served,
        ),
    ]
    for name, doc, value in rows:
        family = GaugeMetricFamily(name, doc)
        family.add_metric([], float("nan") if value is None else float(value))
        yield family
