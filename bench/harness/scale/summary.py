"""One scale-bench case's results: rates, latencies and loads per phase, the exact accounting of
Redis CPU per transition and per GB, and :func:`capacity`, the agents one hub carries at the full
rate."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from typing import Any, NamedTuple

import numpy as np

from .servers import HubServers
from .spec import PARAM_COMMANDS, CaseSpec, Window

AGE_GRID_S = 0.05


def _merge_counts(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for one in counts:
        for key, n in one.items():
            out[key] = out.get(key, 0) + n
    return out


def _pct(samples: np.ndarray, q: float) -> float | None:
    return float(np.percentile(samples, q)) if len(samples) else None


def _in(rows: np.ndarray, t0: float, t1: float) -> np.ndarray:
    return rows[(rows[:, 0] >= t0) & (rows[:, 0] < t1)] if len(rows) else rows


def _steps_in(series: Sequence[np.ndarray], t0: float, t1: float) -> float:
    """Env steps the agents made between t0 and t1 (each agent's cumulative count)."""
    total = 0.0
    for rows in series:
        if not len(rows):
            continue
        before = rows[rows[:, 0] < t0, 1]
        upto = rows[rows[:, 0] < t1, 1]
        total += (upto[-1] if len(upto) else 0.0) - (before[-1] if len(before) else 0.0)
    return total


def version_ages(versions: Sequence[np.ndarray], publishes: np.ndarray, t0: float, t1: float) -> np.ndarray:
    """Every agent's version age (live version - the version it holds, in publishes) on a 50 ms
    grid from t0 to t1, all agents together. ``versions``: per agent, rows (time loaded, version);
    ``publishes``: rows (time live, version, ...)."""
    grid = np.arange(t0, t1, AGE_GRID_S)
    if not len(publishes) or not len(grid):
        return np.zeros(0)
    order = np.argsort(publishes[:, 0])
    live_t, live_v = publishes[order, 0], np.maximum.accumulate(publishes[order, 1])
    live_index = np.searchsorted(live_t, grid, side="right") - 1
    live = np.where(live_index >= 0, live_v[np.maximum(live_index, 0)], 0.0)
    ages = []
    for rows in versions:
        if not len(rows):
            continue
        index = np.searchsorted(rows[:, 0], grid, side="right") - 1
        held = np.where(index >= 0, rows[np.maximum(index, 0), 1], 0.0)
        ages.append(live - held)
    return np.concatenate(ages) if ages else np.zeros(0)


def _ms(samples: np.ndarray) -> dict[str, float | None]:
    seconds = samples[:, 1] if len(samples) else np.zeros(0)
    p50, p99 = _pct(seconds, 50), _pct(seconds, 99)
    return {"n": int(len(seconds)), "p50_ms": None if p50 is None else 1e3 * p50,
            "p99_ms": None if p99 is None else 1e3 * p99}


def headline(out: Mapping[str, Any]) -> str:
    a, b = out["phase_a"], out["phase_b"]
    cap = out["capacity"]["agents_per_hub"]
    return (f"offered {out['offered_sps']:,.0f}/s, produced {a['produced_sps']:,.0f}, acked {a['acked_sps']:,.0f} "
            f"(B: {b['produced_sps']:,.0f}, {b['acked_sps']:,.0f}); busiest Redis {a['redis_cpu_frac_max']:.2f}/"
            f"{b['redis_cpu_frac_max']:.2f} CPU; version age p99 {b.get('version_age_p99')}; "
            f"{'-' if cap is None else f'{cap:,.0f}'} agents per hub at full rate")


def _phase(spec: CaseSpec, labels: Sequence[str], window: Window, first: Mapping[str, Any], last: Mapping[str, Any],
           merged: Mapping[str, np.ndarray], steps: Sequence[np.ndarray], acked: np.ndarray, probe: Mapping[str, Any],
           samples: Sequence[Mapping[str, Any]], client_cpu_s: float) -> dict[str, Any]:
    """Rates, latencies and server loads over ``window.measured .. window.end``."""
    t0, t1 = window.measured, window.end
    dur = t1 - t0
    cpu = {label: last[label]["cpu"] - first[label]["cpu"] for label in labels}
    usec = {label: {cmd: v - first[label]["cmd_usec"].get(cmd, 0.0) for cmd, v in last[label]["cmd_usec"].items()}
            for label in labels}
    downloads = _in(merged["download"], t0, t1)
    busy = (last["machine"][0] - first["machine"][0]) / max(1.0, last["machine"][1] - first["machine"][1])
    peak = [s for s in samples if t0 <= s["t"] < t1] + [last]
    return {
        "seconds": dur,
        "produced_sps": _steps_in(steps, t0, t1) / dur,
        "acked_sps": float(_in(acked, t0, t1)[:, 1].sum()) / dur if len(acked) else 0.0,
        "insert": _ms(_in(merged["insert"], t0, t1)),
        "poll": _ms(_in(merged["poll"], t0, t1)),
        "claim": _ms(_in(merged["claim"], t0, t1)),
        "download": _ms(downloads),
        "probe_poll": _ms(_in(probe["poll"], t0, t1)),
        "probe_ping": _ms(_in(probe["ping"], t0, t1)),
        "redis_cpu_frac": {label: c / dur for label, c in cpu.items()},
        "redis_cpu_frac_max": max(c / dur for c in cpu.values()),
        "param_cmd_usec_share": {label: sum(max(0.0, u.get(c, 0.0)) for c in PARAM_COMMANDS)
                                 / max(1.0, sum(max(0.0, v) for v in u.values())) for label, u in usec.items()},
        "downloads": int(len(downloads)),
        "gb_served": float(downloads[:, 2].sum() / 1e9) if len(downloads) else 0.0,
        "gb_from_replicas": float((downloads[:, 2] * downloads[:, 3]).sum() / 1e9) if len(downloads) else 0.0,
        "machine_busy": busy,
        "client_cpu_frac": client_cpu_s / (window.end - window.start) / (os.cpu_count() or 1),
        "mem_clients_peak": {label: max(s[label]["mem_clients"] for s in peak) for label in labels},
    }


class Marks(NamedTuple):
    """The instants of one case (``time.monotonic()``) and the server snapshots taken at them."""

    before_agents: dict[str, Any]  # the reader, publisher and this process connected, no agent yet
    idle: tuple[dict[str, Any], dict[str, Any]]
    a: Window  # phase A: experience and polls
    a_drained: dict[str, Any]  # snapshot once the reader had every chunk stored in phase A
    a_start: dict[str, Any]
    a_measured: dict[str, Any]
    a_end: dict[str, Any]
    p: Window  # phase P: polls and publishes, no experience
    p_start: dict[str, Any]
    b: Window  # phase B: experience, polls and publishes
    b_start: dict[str, Any]
    b_end: dict[str, Any]
    b_drained: dict[str, Any]  # once the reader had every chunk stored in phase B (before the last flush)


class _Costs(NamedTuple):
    """Redis CPU per server label, accounted exactly (see :func:`_costs`)."""

    fixed: dict[str, float]  # idle rate, CPU seconds per second
    steps_a: float
    steps_b: float
    span_a: float
    span_b: float
    cpu_a: dict[str, float]
    cpu_b: dict[str, float]
    per_t: dict[str, float | None]  # CPU seconds per transition (phase A)
    param_cpu: dict[str, float]  # phase B's CPU seconds beyond experience
    gb: float  # GB the agents downloaded from phase B on
    span_p: float
    net_p: dict[str, float]  # GB each server sent in phase P
    cpu_p: dict[str, float]
    per_gb: dict[str, float | None]  # CPU seconds per GB sent (phase P)
    t_a_drained: float
    t_b_drained: float


def _phases(spec: CaseSpec, labels: Sequence[str], marks: Marks, samples: list[dict[str, Any]],
            workers: list[dict[str, Any]], merged: Mapping[str, np.ndarray], acked: np.ndarray,
            publishes: np.ndarray, probe: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
    """:func:`_phase` of phases A, P and B (the agents' CPU of P and B split pro rata), with the
    version ages of phase B when parameters are on."""
    steps = [rows for w in workers for rows in w["steps"]]
    a = _phase(spec, labels, marks.a, marks.a_measured, marks.a_end, merged, steps, acked, probe, samples,
               sum(w["cpu_s"][0] for w in workers))
    share_b = spec.loaded_s / (spec.params_s + spec.loaded_s)  # the agents' CPU of P and B, pro rata
    p = _phase(spec, labels, marks.p, marks.p_start, marks.b_start, merged, steps, acked, probe, samples,
               sum(w["cpu_s"][1] for w in workers) * (1 - share_b))
    b = _phase(spec, labels, marks.b, marks.b_start, marks.b_end, merged, steps, acked, probe, samples,
               sum(w["cpu_s"][1] for w in workers) * share_b)
    if spec.broadcast.enabled:
        versions = [rows for w in workers for rows in w["versions"]]
        ages = version_ages(versions, publishes, marks.b.measured, marks.b.end)
        if len(ages):
            b.update(version_age_p50=float(np.percentile(ages, 50)), version_age_p99=float(np.percentile(ages, 99)),
                     version_age_max=float(ages.max()), version_age_le2=float((ages <= 2).mean()),
                     # an agent still on the setup's v1 at the end is this far behind: a p99 there
                     # says only that some agents got none of the run's versions
                     version_age_cap=float(publishes[:, 1].max() - 1) if len(publishes) else 0.0)
    return a, p, b


def _costs(labels: Sequence[str], marks: Marks, downloads: np.ndarray, acked: np.ndarray,
           drained: np.ndarray) -> _Costs:
    """Exact accounting: each phase's Redis CPU is counted from its start until the reader had all
    of its chunks; less the idle rate (the reader's polling, the cron, idle connections, measured
    with every agent connected and waiting) that is experience per transition in phase A, and in
    phase B what is left after experience is the parameter traffic's."""
    fixed = {label: (marks.idle[1][label]["cpu"] - marks.idle[0][label]["cpu"]) / (marks.idle[1]["t"] - marks.idle[0]["t"])
             for label in labels}
    t_a_drained, t_b_drained = drained[1, 0], drained[2, 0]
    steps_a = float(_in(acked, marks.a.start - 1.0, t_a_drained + 1e-6)[:, 1].sum()) if len(acked) else 0.0
    steps_b = float(_in(acked, t_a_drained + 1e-6, t_b_drained + 1e-6)[:, 1].sum()) if len(acked) else 0.0
    span_a = marks.a_drained["t"] - marks.a_start["t"]
    span_b = marks.b_drained["t"] - marks.b_start["t"]
    cpu_a = {label: marks.a_drained[label]["cpu"] - marks.a_start[label]["cpu"] for label in labels}
    cpu_b = {label: marks.b_drained[label]["cpu"] - marks.b_start[label]["cpu"] for label in labels}
    per_t = {label: max(0.0, cpu_a[label] - fixed[label] * span_a) / steps_a if steps_a else None for label in labels}
    param_cpu = {label: max(0.0, cpu_b[label] - fixed[label] * span_b - (per_t[label] or 0.0) * steps_b)
                 for label in labels}
    late = _in(downloads, marks.b.start, math.inf)  # those ending after the window too
    gb = float(late[:, 2].sum() / 1e9) if len(late) else 0.0
    # Phase P: parameter traffic alone, counted in the bytes each server sent (pieces in flight at
    # its end count where they were sent).
    span_p = marks.b_start["t"] - marks.p_start["t"]
    net_p = {label: (marks.b_start[label]["net_out"] - marks.p_start[label]["net_out"]) / 1e9 for label in labels}
    cpu_p = {label: marks.b_start[label]["cpu"] - marks.p_start[label]["cpu"] for label in labels}
    per_gb = {label: max(0.0, cpu_p[label] - fixed[label] * span_p) / net_p[label] if net_p[label] > 1e-3 else None
              for label in labels}
    return _Costs(fixed, steps_a, steps_b, span_a, span_b, cpu_a, cpu_b, per_t, param_cpu, gb, span_p, net_p, cpu_p,
                  per_gb, t_a_drained, t_b_drained)


def _memory(labels: Sequence[str], marks: Marks) -> dict[str, Any]:
    """Connections and memory per server: per connection, idle, per agent and at the end."""
    return {
        "connections": {label: marks.a_end[label]["clients"] for label in labels},
        "mem_per_connection_bytes": {label: marks.a_end[label]["mem_clients"] / max(1, marks.a_end[label]["clients"])
                                     for label in labels},
        "used_memory_idle": {label: marks.idle[0][label]["used_memory"] for label in labels},
        "memory_per_agent_bytes": {
            label: (marks.idle[0][label]["used_memory"] - marks.before_agents[label]["used_memory"])
            / max(1, marks.idle[0][label]["clients"] - marks.before_agents[label]["clients"]) for label in labels},
        "used_memory_end": {label: marks.b_drained[label]["used_memory"] for label in labels},
    }


def _counts(workers: list[dict[str, Any]], learner: dict[str, Any], publisher: dict[str, Any],
            probe: dict[str, Any], costs: _Costs) -> dict[str, Any]:
    """Chunks stored, dropped, acked and duplicated; the reader's CPU; failures and timeouts."""
    senders = [s for w in workers for s in w["senders"]]
    drained = learner["drained"]
    return {
        "param_nbytes": publisher["nbytes"],
        "chunks_stored": int(sum(s["chunks"] for s in senders)),
        "chunks_dropped": int(sum(s["chunks_dropped"] for s in senders)),
        "steps_dropped": int(sum(s["steps_dropped"] for s in senders)),
        "sender_retries": int(sum(s["missing_retries"] + s["oom_retries"] + s["error_retries"] for s in senders)),
        "chunks_acked": learner["chunks"], "chunks_unique": learner["unique"], "chunks_duplicated": learner["duplicates"],
        "receiver": learner["stats"], "dead_letters": learner["dead"],
        "learner_cpu_frac": {"a": (drained[1, 1] - drained[0, 1]) / max(1e-9, costs.t_a_drained - drained[0, 0]),
                             "b": (drained[2, 1] - drained[1, 1]) / max(1e-9, costs.t_b_drained - costs.t_a_drained)},
        "claim_wait_s": sum(w["claim_wait_s"] for w in workers),
        "agent_log_counts": _merge_counts(w["log_counts"] for w in workers),
        "param_fetch_failures": sum(n for w in workers for k, n in w["log_counts"].items()
                                    if "parameter fetch failed" in k),
        "reader_timeouts": learner["timeouts"], "probe_timeouts": probe["timeouts"],
        "publish_failures": publisher["failed"],
        "load_avg": os.getloadavg(),
    }


def summarize(spec: CaseSpec, hub: HubServers, marks: Marks, samples: list[dict[str, Any]],
              workers: list[dict[str, Any]], learner: dict[str, Any], publisher: dict[str, Any],
              probe: dict[str, Any]) -> dict[str, Any]:
    """One case's results from its marks, samples and the children's reports."""
    labels = [label for label, _ in hub.servers]
    merged = {kind: np.concatenate([w[kind] for w in workers]) for kind in ("insert", "poll", "claim", "download")}
    acked, publishes = learner["acked"], publisher["publishes"]
    a, p, b = _phases(spec, labels, marks, samples, workers, merged, acked, publishes, probe)
    c = _costs(labels, marks, merged["download"], acked, learner["drained"])
    params_server = hub.params_server
    total_net_p = sum(c.net_p.values())
    shares = download_share(spec.hub, params_server, c.net_p, p, b)
    out: dict[str, Any] = {
        "label": spec.label, "spec": asdict(spec), "profile": asdict(spec.profile),
        "offered_sps": spec.agents * spec.profile.rate, "phase_a": a, "phase_p": p, "phase_b": b,
        "totals": {kind: _ms(rows) for kind, rows in merged.items()},
        "accounting": {"fixed_cpu_frac": c.fixed, "phase_a_steps": c.steps_a, "phase_b_steps": c.steps_b,
                       "phase_a_cpu_s": c.cpu_a, "phase_b_cpu_s": c.cpu_b, "phase_a_span_s": c.span_a,
                       "phase_b_span_s": c.span_b, "drain_a_s": c.t_a_drained - marks.a.end,
                       "drain_b_s": c.t_b_drained - marks.b.end, "param_cpu_s": c.param_cpu,
                       "phase_p_cpu_s": c.cpu_p, "phase_p_net_gb": c.net_p, "phase_p_span_s": c.span_p},
        "redis_cpu_s_per_1k_transitions": {label: None if v is None else 1e3 * v for label, v in c.per_t.items()},
        "redis_cpu_s_per_1k_total": 1e3 * sum(v or 0.0 for v in c.per_t.values()) if c.steps_a else None,
        "redis_cpu_s_per_gb": c.per_gb,
        "param_gb_share": {label: c.net_p[label] / total_net_p if total_net_p else None for label in labels},
        "param_download_share": shares,
        "redis_cpu_s_per_gb_mixed": {label: c.param_cpu[label] / c.gb if c.gb else None for label in labels},
        "params_server": params_server,
        "param_share_of_params_server": (c.param_cpu[params_server] / c.cpu_b[params_server]
                                         if c.cpu_b[params_server] else None),
        **_memory(labels, marks),
        **_counts(workers, learner, publisher, probe, c),
    }
    out["capacity"] = capacity(spec, c.fixed, c.per_t, c.per_gb, shares, publisher["nbytes"], params_server)
    return out


def download_share(hub: str, params_server: str, net_p: Mapping[str, float],
                    *phases: Mapping[str, Any]) -> dict[str, float]:
    """Each server's share of the downloads as the agents saw them in the first of ``phases``
    that completed any: with read replicas, the primary's is what agents read from it (its bytes
    are mostly the replication stream, which :func:`capacity` counts apart; none completed: 0)
    and the replicas split the rest as their bytes in phase P did (evenly if they sent none)."""
    if hub != "replicas":
        return {label: float(label == params_server) for label in net_p}
    served = next((phase for phase in phases if phase["gb_served"]), None)
    from_replicas = 1.0 if served is None else served["gb_from_replicas"] / served["gb_served"]
    replicas = [label for label in net_p if label != params_server]
    replica_net = sum(net_p[label] for label in replicas)
    return {label: 1.0 - from_replicas if label == params_server
            else from_replicas * (net_p[label] / replica_net if replica_net else 1 / len(replicas)) for label in net_p}


def capacity(spec: CaseSpec, fixed: Mapping[str, float], per_t: Mapping[str, float | None],
             per_gb: Mapping[str, float | None], download_share: Mapping[str, float | None], nbytes: int,
             params_server: str) -> dict[str, Any]:
    """What each server's one thread would carry with every agent at the full rate: its idle rate;
    its experience CPU per transition x the offered rate; its CPU per GB (phase P) x its share of
    the downloads x the GB/s that N agents downloading every version they fetch need; and, on a
    primary with read replicas, its CPU per GB x the replication stream of each publish to each
    replica (which does not grow with N). The busiest server bounds the hub: ``agents_per_hub`` is
    the N that fills its core (load 1.0), experience and parameters together and experience
    alone; ``param_share_at_full_rate``: the parameters' share of the load of the server holding
    them (the primary)."""
    cfg = spec.profile
    needed = 0.0
    if spec.broadcast.enabled:
        needed = spec.agents * nbytes / cfg.publish_every_s / spec.broadcast.min_version_lag / 1e9
    replication = 0.0
    if spec.hub == "replicas" and spec.broadcast.enabled:
        replication = nbytes * spec.replicas / cfg.publish_every_s / 1e9
    experience = {label: (v or 0.0) * spec.agents * cfg.rate for label, v in per_t.items()}
    downloads = {label: (per_gb[label] or 0.0) * (download_share.get(label) or 0.0) * needed for label in per_t}
    base = {label: fixed[label] + (per_gb[label] or 0.0) * replication * (label == params_server) for label in per_t}
    params = {label: downloads[label] + base[label] - fixed[label] for label in per_t}
    load = {label: base[label] + experience[label] + downloads[label] for label in per_t}

    def fits(label: str, with_params: bool) -> float:
        per_agent = (experience[label] + downloads[label] * with_params) / spec.agents
        return (1.0 - base[label] * with_params - fixed[label] * (not with_params)) / per_agent if per_agent > 0 else math.inf

    bottleneck = min(per_t, key=lambda label: fits(label, True))
    agents = fits(bottleneck, True)
    exp_only = min(fits(label, False) for label in per_t)
    return {"needed_gb_per_s": needed, "replication_gb_per_s": replication, "load_at_full_rate": load,
            "param_load_at_full_rate": params, "bottleneck": bottleneck,
            "agents_per_hub": None if math.isinf(agents) else agents,
            "agents_per_hub_experience_only": None if math.isinf(exp_only) else exp_only,
            "param_share_at_full_rate": params[params_server] / load[params_server] if load[params_server] else None}
