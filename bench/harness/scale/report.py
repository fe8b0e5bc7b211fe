"""The scale benchmark's results as a figure and as the docs' Markdown tables."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from .spec import BroadcastOptions


def _scaling_row(figure: Any, result: Mapping[str, Any]) -> None:
    """Top row, over N (log scale), a line per env and hub (fp32, free production): produced over
    offered env steps/s (phase A), agents one hub would carry at the full rate (the pooled model),
    p99 insert (solid) and download (dotted) latency, version age p99 (phase B)."""
    axes = [figure.add_subplot(2, 4, i + 1) for i in range(4)]
    lines: dict[str, list[Mapping[str, Any]]] = {}
    for case in result["cases"]:
        spec = case["spec"]
        if spec["broadcast"] != asdict(BroadcastOptions()) or spec["sync"] != "free":
            continue
        lines.setdefault(f"{spec['env']} {spec['hub']}", []).append(case)
    for number, (name, cases) in enumerate(sorted(lines.items())):
        cases = sorted(cases, key=lambda c: c["spec"]["agents"])
        n = [c["spec"]["agents"] for c in cases]
        style: dict[str, Any] = {"color": f"C{number % 10}", "marker": "o", "label": name}
        axes[0].plot(n, [max(c["phase_a"]["produced_sps"], 1.0) / c["offered_sps"] for c in cases], **style)
        model = [c.get("capacity_pooled", c["capacity"])["agents_per_hub"] for c in cases]
        axes[1].plot(n, [math.nan if m is None else m for m in model], **style)
        axes[2].plot(n, [c["totals"]["insert"]["p99_ms"] or math.nan for c in cases], **style)
        axes[2].plot(n, [c["phase_b"]["download"]["p99_ms"] or math.nan for c in cases], linestyle=":",
                     **{**style, "label": None})
        axes[3].plot(n, [c["phase_b"].get("version_age_p99", math.nan) for c in cases], **style)
    titles = ("produced / offered env steps/s (A)", "agents one hub carries at full rate",
              "p99 ms: insert (solid), download (dotted)", "version age p99, publishes (B)")
    for ax, title in zip(axes, titles):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("simulated agents")
        ax.set_title(title, fontsize="medium")
        ax.grid(alpha=0.3)
    for ax in axes[:3]:
        ax.set_yscale("log")
    axes[3].axhline(2, color="gray", linestyle=":", linewidth=1, label="target 2")
    axes[0].legend(fontsize="small")


def _broadcast_row(figure: Any, rows: Sequence[Mapping[str, Any]]) -> None:
    """Bottom row, the parameter-broadcast options at the section-2 N: GB/s needed and served,
    the parameters' share of their server's CPU, the most parameter load on one server and the
    busiest server's load, the last three at the full rate."""
    labels = [row["label"].split(" / ", 2)[-1] for row in rows]
    n = rows[0]["label"].split(" / ")[1]
    x = np.arange(len(rows))
    ax = figure.add_subplot(2, 4, 5)
    ax.bar(x - 0.2, [row["needed_gb_per_s"] for row in rows], 0.4, color="C7", label="needed at full rate")
    ax.bar(x + 0.2, [row["gb_served_per_s"] for row in rows], 0.4, color="C0", label="served here (B)")
    ax.set_yscale("log")
    ax.legend(fontsize="x-small")
    panels = (("parameters' share of their server, full rate", "param_share_at_full_rate", 0.25),
              ("most parameter load on one server (cores), full rate", "param_only_load_at_full_rate", 1.0),
              ("busiest server's load (cores), full rate", "busiest_load_at_full_rate", 1.0))
    axes_b = [ax] + [figure.add_subplot(2, 4, 6 + i) for i in range(3)]
    axes_b[0].set_title(f"parameter GB/s, {n} Pong agents", fontsize="small")
    for ax, (title, key, target) in zip(axes_b[1:], panels):
        values = [row[key] for row in rows]
        ax.bar(x, [math.nan if v is None else v for v in values], color=[f"C{i % 10}" for i in range(len(rows))])
        ax.axhline(target, color="gray", linestyle=":", linewidth=1)
        ax.set_title(f"{title}, {n} Pong agents", fontsize="small")
        if key != "param_share_at_full_rate":
            ax.set_yscale("log")
    for ax in axes_b:
        ax.set_xticks(x, labels, rotation=35, ha="right", fontsize="x-small")
        ax.grid(axis="y", alpha=0.3)


def scale_figure(result: Mapping[str, Any]) -> Any:
    """The results over N (top row, :func:`_scaling_row`) and the parameter-broadcast options
    (bottom row, :func:`_broadcast_row`, when measured), as a matplotlib figure."""
    from surreal_redis.plots import _figure

    figure = _figure(4, width=4.2, height=7.2)
    _scaling_row(figure, result)
    rows = result.get("broadcast") or []
    if rows:
        _broadcast_row(figure, rows)
    mach = result.get("machine_start", {})
    figure.suptitle(f"bench/scale.py ({mach.get('cpus')} cores shared by the simulated agents, reader, publisher and Redis)")
    return figure


def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}" if abs(value) < 10 else f"{value:.0f}"


def _pair(summary: Mapping[str, Any]) -> str:
    return f"{_fmt(summary['p50_ms'])} / {_fmt(summary['p99_ms'])}" if summary["n"] else "—"


def markdown_tables(result: Mapping[str, Any]) -> str:
    """The results as the docs' two Markdown tables: per case, and the parameter-broadcast options."""
    lines = ["| env | hub | N | offered steps/s | produced / acked (A) | insert ms p50 / p99 | poll ms p50 / p99 "
             "| download ms p50 / p99 (B) | busiest Redis CPU A / B | Redis CPU-s per 1k steps | per GB (P) "
             "| KB per connection | agents per hub at full rate (experience only) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for case in result["cases"]:
        spec, a, b = case["spec"], case["phase_a"], case["phase_b"]
        hub = spec["hub"] + ("" if spec["sync"] == "free" else f", {spec['sync']}")
        if spec["broadcast"] != asdict(BroadcastOptions()):
            hub += ", " + BroadcastOptions(**spec["broadcast"]).label
        model = case.get("capacity_pooled", case["capacity"])
        shares = {k: v or 0.0 for k, v in case["param_gb_share"].items()}
        per_gb = case["redis_cpu_s_per_gb"].get(max(shares, key=lambda k: shares[k]))
        kb = max(case["mem_per_connection_bytes"].values()) / 1024
        lines.append(
            f"| {spec['env']} | {hub} | {spec['agents']} | {_fmt(case['offered_sps'])} "
            f"| {_fmt(a['produced_sps'])} / {_fmt(a['acked_sps'])} | {_pair(case['totals']['insert'])} "
            f"| {_pair(a['poll'])} | {_pair(b['download'])} "
            f"| {a['redis_cpu_frac_max']:.2f} / {b['redis_cpu_frac_max']:.2f} "
            f"| {_fmt(case['redis_cpu_s_per_1k_total'], 3)} | {_fmt(per_gb)} | {kb:.1f} "
            f"| {_fmt(model['agents_per_hub'])} ({_fmt(model['agents_per_hub_experience_only'])}) |")
    rows = result.get("broadcast") or []
    if rows:
        lines += ["", "| parameters | version age p99 (B) | their share of its server's CPU (B) | at full rate "
                      "| most parameter load on one server at full rate | busiest server's load at full rate "
                      "| GB/s needed at full rate |",
                  "|---|---|---|---|---|---|---|"]
        for row in rows:
            capped = row["version_age_p99"] is not None and row["version_age_p99"] >= (row["version_age_cap"] or math.inf)
            lines.append(f"| {row['label']} | {'>= ' if capped else ''}{_fmt(row['version_age_p99'])} "
                         f"| {_fmt(row['param_cpu_share'])} "
                         f"| {_fmt(row['param_share_at_full_rate'])} | {_fmt(row['param_only_load_at_full_rate'])} "
                         f"| {_fmt(row['busiest_load_at_full_rate'])} "
                         f"| {_fmt(row['needed_gb_per_s'])} |")
    return "\n".join(lines)
