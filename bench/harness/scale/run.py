"""The whole scale benchmark: every case of a :class:`~harness.scale.spec.BenchPlan`, the
per-transition and per-GB costs pooled over cases, and the parameter-broadcast summary."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from .case import run_case
from .params import fp16_logit_check, load_params, trained_pong_params
from .spec import BenchPlan, BroadcastOptions, CaseSpec
from .summary import capacity, download_share


def _role(case: Mapping[str, Any], label: str) -> str:
    """A server's role in a case: ``params`` (it holds the parameter keys), ``replica`` or ``other``."""
    if label == case["params_server"]:
        return "params"
    return "replica" if label.startswith("replica") else "other"


def pooled_per_gb(cases: Sequence[Mapping[str, Any]], least_gb: float = 0.05) -> dict[tuple[str, str], float]:
    """Redis CPU seconds per GB of phase P pooled over every case of one hub kind, per server role
    (``params``: the server holding the parameter keys; ``replica``; ``other``: cluster nodes
    without them), over the cases whose servers sent at least ``least_gb`` (a small blob's few
    MB leave the figure to noise)."""
    cpu: dict[tuple[str, str], float] = {}
    gb: dict[tuple[str, str], float] = {}
    for case in cases:
        acc = case["accounting"]
        for label, net in acc["phase_p_net_gb"].items():
            if net < least_gb:
                continue
            key = (case["spec"]["hub"], _role(case, label))
            cpu[key] = cpu.get(key, 0.0) + max(0.0, acc["phase_p_cpu_s"][label]
                                               - acc["fixed_cpu_frac"][label] * acc["phase_p_span_s"])
            gb[key] = gb.get(key, 0.0) + net
    return {key: cpu[key] / gb[key] for key in cpu}


def pooled_per_t(cases: Sequence[Mapping[str, Any]], least_steps: float = 2000) -> dict[tuple[str, str, str], float]:
    """Redis CPU seconds per transition per (env, hub kind, server role), pooled over every case
    of that env and hub kind whose phase A stored at least ``least_steps`` transitions: the
    phases' CPU beyond the idle rate over all their transitions."""
    cpu: dict[tuple[str, str, str], float] = {}
    steps: dict[tuple[str, str, str], float] = {}
    for case in cases:
        acc = case["accounting"]
        if acc["phase_a_steps"] < least_steps:
            continue
        for label, used in acc["phase_a_cpu_s"].items():
            key = (case["spec"]["env"], case["spec"]["hub"], _role(case, label))
            cpu[key] = cpu.get(key, 0.0) + max(0.0, used - acc["fixed_cpu_frac"][label] * acc["phase_a_span_s"])
            steps[key] = steps.get(key, 0.0) + acc["phase_a_steps"]
    return {key: cpu[key] / steps[key] for key in cpu}


def pooled_capacity(case: Mapping[str, Any], pooled: Mapping[tuple[str, str], float],
                    per_t_pooled: Mapping[tuple[str, str, str], float]) -> dict[str, Any]:
    """:func:`capacity` of ``case`` with the pooled CPU per GB of its hub kind and the pooled
    per-transition CPU of its env and hub kind (its own values where nothing was pooled for a
    server's role): the costs of all N together, applied to this case's N, shares and idle rate."""
    raw = case["spec"]
    spec = CaseSpec(**{**raw, "broadcast": BroadcastOptions(**raw["broadcast"])})
    per_t = {label: per_t_pooled.get((raw["env"], raw["hub"], _role(case, label)),
                                     None if v is None else v / 1e3)
             for label, v in case["redis_cpu_s_per_1k_transitions"].items()}
    per_gb = {label: pooled.get((raw["hub"], _role(case, label)), case["redis_cpu_s_per_gb"][label]) for label in per_t}
    share = download_share(raw["hub"], case["params_server"], case["accounting"]["phase_p_net_gb"], case["phase_p"],
                            case["phase_b"])
    return capacity(spec, case["accounting"]["fixed_cpu_frac"], per_t, per_gb, share, case["param_nbytes"],
                    case["params_server"])


def machine() -> dict[str, Any]:
    """CPU count, model and load of this machine."""
    model = ""
    try:
        with open("/proc/cpuinfo") as info:
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "")
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model, "load_avg": os.getloadavg()}


def run_scale_bench(plan: BenchPlan, quick: bool = False) -> dict[str, Any]:
    """Every case of ``plan`` one after another, the fp16 logit check (fresh weights; also
    trained ones, :func:`trained_pong_params`, unless ``quick``), capacities and the
    parameter-broadcast targets (section 2: with ``broadcast_agents`` Pong agents, version age
    p99 <= 2 publishes and < 25% of the parameter server's CPU on parameters; which options meet
    them). Blocks for the whole run."""
    started = time.monotonic()
    params = load_params(plan.envs)
    out: dict[str, Any] = {"quick": quick, "machine_start": machine(), "plan": asdict(plan), "cases": []}
    for spec in plan.cases():
        out["cases"].append(run_case(spec, params[spec.env]))
    pooled = pooled_per_gb(out["cases"])
    per_t = pooled_per_t(out["cases"])
    out["pooled_cpu_s_per_gb"] = {f"{hub} {role}": v for (hub, role), v in pooled.items()}
    out["pooled_cpu_s_per_1k_transitions"] = {f"{env} {hub} {role}": 1e3 * v for (env, hub, role), v in per_t.items()}
    for case in out["cases"]:
        case["capacity_pooled"] = pooled_capacity(case, pooled, per_t)
    if "pong" in params:
        out["fp16_check"] = fp16_logit_check(params["pong"])
        if not quick:
            with mp.get_context("spawn").Pool(1) as pool:  # torch stays out of this process
                out["fp16_check_trained"] = fp16_logit_check(pool.apply(trained_pong_params))
    out["broadcast"] = broadcast_summary(out["cases"], plan.broadcast_agents)
    out["machine_end"] = machine()
    out["seconds"] = round(time.monotonic() - started, 1)
    return out


def broadcast_summary(cases: Sequence[Mapping[str, Any]], agents: int | None) -> list[dict[str, Any]]:
    """Section 2: every Pong case at ``agents`` (at the largest N measured when None) with
    parameters on: version age p99 in phase B (target <= 2 publishes) and the parameter server's
    CPU share on parameters (target < 25%), both as measured here (phase B, this machine's agents
    short of CPU) and at the full rate (the pooled capacity model)."""
    pong = [c for c in cases if c["spec"]["env"] == "pong" and c["spec"]["broadcast"]["enabled"]]
    if not pong:
        return []
    n = agents if agents is not None else max(c["spec"]["agents"] for c in pong)
    rows = []
    for case in pong:
        if case["spec"]["agents"] != n:
            continue
        b = case["phase_b"]
        age, share = b.get("version_age_p99"), case["param_share_of_params_server"]
        model = case.get("capacity_pooled", case["capacity"])
        full_share = model["param_share_at_full_rate"]
        params_load = model["load_at_full_rate"][case["params_server"]]
        rows.append({"label": case["label"], "version_age_p99": age, "version_age_le2": b.get("version_age_le2"),
                     "version_age_cap": b.get("version_age_cap"),
                     "param_cpu_share": share, "param_share_at_full_rate": full_share,
                     "params_server_load_at_full_rate": params_load,
                     "param_only_load_at_full_rate": max(model["param_load_at_full_rate"].values()),
                     "busiest_load_at_full_rate": max(model["load_at_full_rate"].values()),
                     "age_met": age is not None and age <= 2, "share_met": share is not None and share < 0.25,
                     "share_met_at_full_rate": full_share is not None and full_share < 0.25,
                     "produced_over_offered": b["produced_sps"] / case["offered_sps"],
                     "download_p99_ms": b["download"]["p99_ms"], "gb_served_per_s": b["gb_served"] / b["seconds"],
                     "needed_gb_per_s": model["needed_gb_per_s"]})
    return rows
