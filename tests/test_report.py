"""report.py's pure pieces: the verdicts, `summarize`, `simulate_to_dir`, `measured_trace`.

The verdicts are fed small hand-made summaries (no simulation) that should say yes and no;
`summarize` a hand-made result whose numbers can be worked out on paper; `simulate_to_dir` a
two-minute trace, its metrics.json recomputed from the requests.csv it wrote.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from minivtc.engine.engine_config import EngineConfig
from minivtc.experiments import plots
from minivtc.experiments.paper_table import (
    EXPERIMENTS,
    gap_verdict,
    lcf_verdict,
    prediction_verdict,
    profile_verdict,
    share_verdict,
    table2_verdict,
    ttft_verdict,
)
from minivtc.experiments.report import SPECIAL, measured_trace, simulate_to_dir, summarize
from minivtc.fairness.policies import make_scheduler
from minivtc.sim import metrics
from minivtc.sim.metrics import Served
from minivtc.sim.simulator import SimResult
from minivtc.sim.workloads import (
    A10G_RUNS,
    TraceRequest,
    read_trace,
    uniform,
    workload,
    write_trace,
)

RUNS = A10G_RUNS

# metrics.json: what summarize returns, then what simulate_to_dir adds
SUMMARY_KEYS = {
    "served",
    "rejected",
    "max_diff",
    "avg_diff",
    "diff_var",
    "throughput_tok_s",
    "jain_index",
    "max_accumulated_gap",
    "max_gap_first_half",
    "last_gap",
    "two_u",
    "simulated_s",
    "wall_s",
    "steps",
    "preemptions",
    "recomputed_tokens",
    "service_per_client",
    "service_rate_60_300",
    "mean_ttft_per_client",
    "backlogged_gap",
    "bound",
    "prefix_hit_rate",
    "prefill_tokens_saved",
    "swapped_tokens",
}
RUN_KEYS = {
    "workload",
    "scheduler",
    "step_time",
    "kv_tokens",
    "reservation",
    "victim",
    "preempt_gap",
    "block_size",
    "prefix_caching",
    "cached_weight",
    "preemption",
    "swap_tokens",
}


def said(text: str) -> str:
    """The answer at the end of a one-check verdict: "yes" or "no" (any case)."""
    return text.rsplit(":", 1)[1].strip().strip(").").lower()


# --- the verdicts ----------------------------------------------------------------------------


def gaps(first_half: float, last: float) -> dict:
    peak = max(first_half, last)
    return {"max_gap_first_half": first_half, "last_gap": last, "max_accumulated_gap": peak}


@pytest.mark.parametrize("last,flat", [(5000, "yes"), (12500, "yes"), (12600, "NO")])
def test_gap_verdict_asks_whether_vtc_stops_growing(last, flat):
    """Flat: the end of the run is within 25% of the first half's largest gap."""
    text = gap_verdict({"vtc": gaps(10_000, last)})
    assert text.startswith(f"VTC gap stops growing: {flat} ")
    assert "2U = 40k" in text and "FCFS" not in text  # the paper's pool, M = 10000


@pytest.mark.parametrize("fcfs,larger", [(30_000, "yes"), (20_000, "no")])
def test_gap_verdict_compares_fcfs_when_it_ran(fcfs, larger):
    text = gap_verdict({"vtc": gaps(10_000, 8000), "fcfs": gaps(5000, fcfs)})
    assert text.endswith(f"FCFS grows to {fcfs // 1000}k ({larger}, larger)")


@pytest.mark.parametrize("b,ok", [(200, "yes"), (249, "yes"), (251, "no"), (100, "no")])
def test_share_verdict_is_within_a_quarter_of_the_ratio(b, ok):
    runs = {"vtc": {"service_rate_60_300": {"a": 100.0, "b": float(b)}}}
    assert said(share_verdict("a", "b", 2.0)(runs)) == ok


@pytest.mark.parametrize("light,ok", [(1.0, "yes"), (19.9, "yes"), (20.0, "no"), (150.0, "no")])
def test_ttft_verdict_wants_the_light_client_five_times_faster(light, ok):
    runs = {"vtc": {"mean_ttft_per_client": {"light": light, "heavy": 100.0}}}
    assert said(ttft_verdict("light", "heavy")(runs)) == ok


def table2_runs(**changes) -> dict[str, dict]:
    """Summaries shaped like the paper's Table 2, where every check holds."""
    rows = {
        "fcfs": (760, 777),
        "lcf": (750, 778),
        "vtc": (368, 779),
        "vtc-oracle": (329, 781),
        "rpm:5": (144, 340),
    }
    rows.update(changes)
    return {k: {"max_diff": d, "throughput_tok_s": t} for k, (d, t) in rows.items()}


def test_table2_verdict_yes_on_the_papers_table():
    answers = [check.rsplit(": ", 1)[1] for check in table2_verdict(table2_runs()).split("; ")]
    assert answers == ["yes"] * 4


@pytest.mark.parametrize(
    "changes,broken",
    [
        ({"lcf": (300, 778)}, "FCFS, LCF > VTC"),
        ({"vtc-oracle": (400, 781)}, "VTC >= VTC-oracle"),
        ({"rpm:5": (400, 400)}, "RPM(5) under half of VTC's throughput"),
        ({"vtc": (368, 800)}, "VTC within 2% of FCFS throughput"),
    ],
)
def test_table2_verdict_says_no_to_each_broken_check(changes, broken):
    checks = dict(c.rsplit(": ", 1) for c in table2_verdict(table2_runs(**changes)).split("; "))
    assert checks == {name: "NO" if name == broken else "yes" for name in checks}


def test_lcf_verdict():
    def runs(lcf):
        return {"vtc": {"max_diff": 300.0}, "lcf": {"max_diff": lcf}}

    assert said(lcf_verdict(runs(700.0))) == "yes"
    assert said(lcf_verdict(runs(300.0))) == said(lcf_verdict(runs(200.0))) == "no"


@pytest.mark.parametrize(
    "avg,ok", [((100, 12, 1), "yes"), ((100, 12, 12), "no"), ((10, 12, 1), "no")]
)
def test_prediction_verdict_wants_avg_diff_to_fall(avg, ok):
    keys = ("vtc", "vtc-oracle:0.5", "vtc-oracle")
    runs = {k: {"avg_diff": float(a)} for k, a in zip(keys, avg, strict=True)}
    assert said(prediction_verdict(runs)) == ok


@pytest.mark.parametrize(
    "diffs,ok", [((323, 137, 4), "yes"), ((100, 137, 4), "no"), ((323, 137, 200), "no")]
)
def test_profile_verdict_wants_fcfs_vtc_oracle_in_order(diffs, ok):
    keys = ("fcfs", "vtc-profile", "vtc-oracle-profile")
    runs = {k: {"max_diff": float(d)} for k, d in zip(keys, diffs, strict=True)}
    assert said(profile_verdict(runs)) == ok


def test_experiments_name_real_workloads_and_schedulers():
    keys = [e.key for e in EXPERIMENTS] + list(SPECIAL)
    assert len(keys) == len(set(keys))
    for e in EXPERIMENTS:
        workload(e.workload)
        for name in e.schedulers:
            make_scheduler(name)
        assert set(e.figures) <= {"service", "response", "gap"}, e.key


@pytest.mark.parametrize("e", EXPERIMENTS, ids=lambda e: e.key)
def test_each_verdict_reads_only_what_its_own_runs_produce(e):
    """A verdict runs after minutes of simulation: it must find every scheduler and client it
    reads among the experiment's summaries, and answer yes or no."""
    clients = sorted({t.client for t in workload(e.workload).make()})
    served = [Served(c, 0.0, 100, 100, 30.0 + i, 400.0) for i, c in enumerate(clients)]
    summary = summarize(SimResult(served, [], 400.0, 0.0, 1), 600, 10000, 100, e.cost)
    text = e.verdict({name: summary for name in e.schedulers})
    assert "yes" in text.lower() or "no" in text.lower()


# --- summarize -------------------------------------------------------------------------------


def two_clients() -> SimResult:
    """a: first token at 60 s, done at 300 s; b: first token at 180 s, done at 300 s. Each
    costs 40 + 2 * 100 = 240, spread over its decode span: a at 1/s, b at 2/s."""
    served = [Served("a", 0.0, 40, 100, 60.0, 300.0), Served("b", 0.0, 40, 100, 180.0, 300.0)]
    return SimResult(served, [TraceRequest("c", 1.0, 5, 5)], 300.0, 0.5, 77)


def test_summarize_by_hand():
    s = summarize(two_clients(), horizon=300, kv_tokens=1000, max_input=40)
    assert set(s) == SUMMARY_KEYS
    assert (s["served"], s["rejected"], s["steps"], s["simulated_s"]) == (2, 1, 77, 300.0)
    assert s["service_per_client"] == {"a": 240.0, "b": 240.0}
    assert s["service_rate_60_300"] == {"a": 1.0, "b": 1.0}  # 240 over 240 s each
    assert s["mean_ttft_per_client"] == {"a": 60.0, "b": 180.0}
    assert s["jain_index"] == 1.0  # equal service over [30 s, horizon]
    # A_a(x) = x - 60 from 60 s, A_b(x) = 2 (x - 180) from 180 s; ticks every 15 s to 285 s
    assert s["max_accumulated_gap"] == 120.0  # at 180 s
    assert s["max_gap_first_half"] == 75.0  # at 135 s, the 9th of 19 ticks
    assert s["last_gap"] == 15.0  # |225 - 210| at 285 s
    assert s["two_u"] == 2 * max(1 * 40, 2 * 1000)  # Theorem 4.4: 2U, U = max(w_p L, w_q M)
    assert s["throughput_tok_s"] == round(2 * 140 / 300, 1)


def test_summarize_prices_service_with_the_cost_it_is_given():
    """The "profile" tables (Table 3, Table 4) price service with the fitted h."""
    result = two_clients()
    s = summarize(result, 300, 1000, 40, cost=metrics.profiled_cost)
    h = metrics.profiled_cost(result.served[0])
    assert s["service_per_client"] == {"a": round(h, 1), "b": round(h, 1)}
    assert s["service_rate_60_300"]["a"] == round(h / 240, 1)
    assert s["throughput_tok_s"] == round(2 * 140 / 300, 1)  # tokens, whatever the price


def test_jain_index_falls_when_one_client_is_starved():
    result = two_clients()
    result.served[1] = Served("b", 0.0, 4, 10, 180.0, 300.0)  # b gets a tenth of a's service
    assert summarize(result, 300, 1000, 40)["jain_index"] < 0.7


# --- simulate_to_dir -------------------------------------------------------------------------


def test_simulate_to_dir_writes_its_files_and_numbers_from_its_requests(tmp_path):
    """metrics.json holds what minivtc.sim.metrics computes from the requests.csv beside it."""
    trace = uniform([1.0, 2.0], 120, lengths=(200, 100))  # both clients above their share
    write_trace(tmp_path / "t.csv", trace)
    out = tmp_path / "out"
    spec = EngineConfig.of("vtc", kv_tokens=4000, block_size=1, reservation="peak")
    got = simulate_to_dir(str(tmp_path / "t.csv"), spec, "a10g-llama7b", out)
    assert sorted(p.name for p in out.iterdir()) == [
        "gap.png",
        "metrics.json",
        "requests.csv",
        "response.png",
        "service.png",
    ]
    assert all((out / name).stat().st_size > 0 for name in ("gap.png", "service.png"))
    saved = json.loads((out / "metrics.json").read_text())
    assert saved == got and set(saved) == SUMMARY_KEYS | RUN_KEYS
    assert (saved["scheduler"], saved["step_time"], saved["kv_tokens"]) == (
        "vtc",
        "a10g-llama7b",
        4000,
    )
    assert saved["workload"] == str(tmp_path / "t.csv")
    assert saved["two_u"] == 2 * max(200, 2 * 4000)

    served = metrics.read_requests(out / "requests.csv")

    def key(r: Served | TraceRequest) -> tuple:
        return r.client, r.arrival_s, r.input_tokens, r.output_tokens

    # every request of the trace file, once (both files keep arrivals to the microsecond)
    assert sorted(map(key, served)) == sorted(map(key, read_trace(tmp_path / "t.csv")))
    assert saved["served"] == len(served) and saved["rejected"] == 0
    horizon = float(int(trace[-1].arrival_s))  # a trace file's horizon: its last arrival
    total = max(r.end_s for r in served) - min(r.arrival_s for r in served)
    table = metrics.table_metrics(served, total, horizon=horizon)
    _, acc = metrics.accumulated_service_diff(served, horizon)
    close = {"abs": 0.02, "rel": 1e-4}  # requests.csv keeps microseconds; metrics.json rounds
    assert saved["max_diff"] == pytest.approx(table.max_diff, **close) and table.max_diff > 0
    assert saved["avg_diff"] == pytest.approx(table.avg_diff, **close)
    assert saved["throughput_tok_s"] == pytest.approx(table.throughput, abs=0.1)
    assert saved["simulated_s"] == pytest.approx(total, abs=0.1)
    assert saved["max_accumulated_gap"] == pytest.approx(max(acc), abs=0.1)
    assert saved["last_gap"] == pytest.approx(acc[-1], abs=0.1)
    totals = metrics.service(served, 0.0, float("inf"))
    assert saved["service_per_client"] == pytest.approx(totals, abs=0.1)
    assert saved["mean_ttft_per_client"] == pytest.approx(metrics.mean_ttft(served), abs=1e-3)
    jain = metrics.jain_index(metrics.service(served, 30.0, horizon).values())
    assert saved["jain_index"] == pytest.approx(jain, abs=1e-4)


@pytest.mark.slow
def test_simulate_to_dir_runs_a_named_workload_with_its_weights(tmp_path):
    """Figure 16: by name, the workload's own weights reach the scheduler (shares 1:2:3:4)."""
    spec = EngineConfig.of("vtc", kv_tokens=10000, block_size=1, reservation="peak")
    got = simulate_to_dir("overload-weighted", spec, "a10g-llama7b", tmp_path)
    assert got["workload"] == "overload-weighted" and got["served"] == len(
        workload("overload-weighted").make()
    )
    rates = got["service_rate_60_300"]
    for i, client in enumerate(sorted(rates)):
        assert rates[client] / rates["client-00"] == pytest.approx(i + 1, rel=0.1), client


# --- measured_trace --------------------------------------------------------------------------

INDEX = json.loads((RUNS / "index.json").read_text())


@pytest.mark.parametrize("run", INDEX, ids=lambda r: r["run"])
def test_measured_trace_is_the_trace_the_measured_run_served(run):
    """The artifact's generator seeded NumPy where ours seeds Python's `random`: the same
    requests per client, each client's arrivals the measured ones shifted by less than one
    period (the real trace: the same arrivals)."""
    trace = measured_trace(run["config"])
    measured = metrics.read_requests(RUNS / f"{run['run']}.csv")
    assert len(trace) == run["n_responses"] + run["num_abort"] == len(measured)
    lengths = Counter((r.client, r.input_tokens, r.output_tokens) for r in trace)
    assert lengths == Counter((r.client, r.input_tokens, r.output_tokens) for r in measured)
    rates = run["config"]["req_rate"]
    for i, client in enumerate(sorted({r.client for r in measured})):
        ours = sorted(r.arrival_s for r in trace if r.client == client)
        theirs = sorted(r.arrival_s for r in measured if r.client == client)
        shifts = [a - b for a, b in zip(ours, theirs, strict=True)]
        if isinstance(rates, list):  # evenly spaced: one constant shift, under one period
            assert max(shifts) - min(shifts) < 1e-5 and abs(shifts[0]) < 1 / rates[i], client
        else:
            assert max(map(abs, shifts)) < 1e-6, client


def test_measured_trace_follows_the_on_off_setting():
    config = next(r["config"] for r in INDEX if r["run"] == "VTC__on_off_less")
    quiet = [t for t in measured_trace(config) if t.client == "client-00" and t.arrival_s // 60 % 2]
    assert config["on_off"] == 60 and not quiet
    always_on = dict(config, on_off=-1)
    assert len(measured_trace(always_on)) > len(measured_trace(config))


def test_the_fair_memory_and_prefix_caching_figures_draw_their_rows(tmp_path):
    """A row without a stated bound is drawn without one; one client's bars per panel each."""
    rows = [
        ("full reservation", 326.0, 5374.0, 40000.0),
        ("on demand, latest", 771.0, 17857.0, None),
    ]
    shares = {
        "one": {"no cache": [1.0, 2.0, 3.0], "w_c = 0": [3.0, 2.0, 1.0]},
        "two": {"no cache": [1.0, 1.0, 1.0]},
    }
    for path in (
        plots.tradeoff_plot(rows, tmp_path / "t.png"),
        plots.shares_plot(shares, ["A", "B", "C"], tmp_path / "s.png"),
    ):
        assert path.read_bytes().startswith(b"\x89PNG")
