"""The run's record: metrics.json for programs, summary.md for people."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libs.core.config import PolicyConfig
from libs.core.model import DEBUG_MAX_GPUS, DEBUG_MAX_MIN_RUNTIME_S
from libs.core.service_level import SMALL_TEAM_OWED_FRACTION
from libs.sim.driver import SimSettings
from libs.sim.recorder import CLASSES, SIZES, AllocationMetrics, Metrics, Unstarted
from libs.sim.scenario import Scenario, Targets
from libs.sim.tables import Columns, markdown_table, table
from libs.sim.workload import Workload


@dataclass(frozen=True)
class RunInfo:
    scenario: Scenario
    config: PolicyConfig
    settings: SimSettings


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _percent(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}%"


def _worst_day(m: Metrics) -> str:
    return _percent(
        min((p for p in m.owed_delivered_min_pct_by_day if p is not None), default=None)
    )


def _small_teams(m: Metrics) -> str:
    """The teams under the headline's floor: how many, their share of owed, their worst."""
    small = m.owed_small_teams
    if not small.count:
        return "none"
    return f"{small.count} ({small.owed_pct:.2f}% of owed; worst {_percent(small.min_pct)})"


def _sizes(m: Metrics) -> str:
    return " · ".join(f"{k}: {_percent(v, 0)}" for k, v in m.started_pct_by_size.items())


SUMMARY: Columns[Metrics] = (
    ("policy", lambda m: m.policy),
    ("owed delivered, worst team", lambda m: _percent(m.owed_delivered_min_pct)),
    ("weighted", lambda m: _percent(m.owed_delivered_weighted_pct)),
    ("small teams", _small_teams),
    ("worst day", _worst_day),
    ("occupancy", lambda m: f"{m.occupancy_pct:.1f}%"),
    ("debug p90 wait", lambda m: duration(m.waits["debug"].p90)),
    ("lost GPU-h", lambda m: f"{m.lost_gpu_h_pct:.1f}%"),
    ("started by size (GPUs)", _sizes),
    ("sim CPU", lambda m: f"{m.sim_cpu_s:.1f} s"),
)


def workload_profile(workload: Workload) -> dict[str, Any]:
    """How the trace's jobs fell into classes and teams."""
    classes = {c: {"jobs": 0, "gpu_h": 0.0} for c in CLASSES}
    teams = {t: _team(share) for t, share in workload.tree.entitlements().items()}
    cpu_only = {"jobs": 0, "hours": 0.0}
    for job in workload.jobs:
        if job.spec.gpus == 0:  # no work class: every policy rejects them
            cpu_only["jobs"] += 1
            cpu_only["hours"] += job.runtime_s / 3600
            continue
        gpu_h = job.spec.gpus * job.runtime_s / 3600
        entry = classes[job.spec.work_class.value]
        entry["jobs"] += 1
        entry["gpu_h"] += gpu_h
        team = teams.setdefault(job.spec.allocation, _team(0.0))
        team["users"].add(job.spec.user)
        team["jobs"] += 1
        if job.spec.allocated:
            team["charged_gpu_h"] += gpu_h
    for team in teams.values():
        team["users"] = len(team["users"])
    hashed = [job for job in workload.jobs if job.job_id in workload.hashed]
    by_hash = {"jobs": len(hashed), "users": len({job.spec.user for job in hashed})}
    return {
        "classes": classes,
        "teams": dict(sorted(teams.items())),
        "cpu_only": cpu_only,
        "placed_by_hash": by_hash,
        "left_out": left_out_records(workload),
    }


def left_out_records(workload: Workload) -> list[dict[str, str]]:
    """A recorded log's jobs the replay leaves out, as metrics.json and -o json list them."""
    return [{"job_id": job.job_id, "why": job.why} for job in workload.left_out]


def left_out_note(workload: Workload) -> str:
    """How many of a recorded log's jobs the replay leaves out, and why; empty if none."""
    if not workload.left_out:
        return ""
    whys = Counter(job.why for job in workload.left_out)
    recorded = len(workload.jobs) + len(workload.left_out)
    return (
        f"{len(workload.left_out)} of the log's {recorded} jobs left out, with no run to "
        f"replay: " + "; ".join(f"{count} {why}" for why, count in sorted(whys.items()))
    )


def _team(entitlement: float) -> dict[str, Any]:
    return {"entitlement": entitlement, "users": set(), "jobs": 0, "charged_gpu_h": 0.0}


def metrics_json(
    info: RunInfo, workload: Workload, profile: dict[str, Any], results: Sequence[Metrics]
) -> dict[str, Any]:
    """``profile``: the workload's ``workload_profile``."""
    policies = {}
    for m in results:
        entry = dataclasses.asdict(m)
        entry["total_preemptions"] = m.total_preemptions
        for alloc, raw in zip(m.allocations, entry["allocations"], strict=True):
            raw["delivered_pct"] = alloc.delivered_pct
        policies[m.policy] = entry
    return {
        "scenario": dataclasses.asdict(info.scenario),
        "policy_config": dataclasses.asdict(info.config),
        "settings": dataclasses.asdict(info.settings),
        "workload": {
            "jobs": len(workload.jobs),
            "capacity_gpus": workload.capacity,
            "nodes": len(workload.nodes),
            "offered_load": workload.offered_load(),
            **profile,
        },
        "policies": policies,
    }


def write_report(
    out: Path,
    info: RunInfo,
    workload: Workload,
    results: Sequence[Metrics],
    plots: Sequence[Path] = (),
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    profile = workload_profile(workload)
    data = metrics_json(info, workload, profile, results)
    text = json.dumps(data, indent=1, sort_keys=True, default=str)  # paths as text
    (out / "metrics.json").write_text(text + "\n")
    summary = summary_markdown(info, workload, profile, results, plots, out)
    (out / "summary.md").write_text(summary)


def summary_markdown(
    info: RunInfo,
    workload: Workload,
    profile: dict[str, Any],
    results: Sequence[Metrics],
    plots: Sequence[Path] = (),
    out: Path | None = None,
) -> str:
    """``profile``: the workload's ``workload_profile``."""
    sc, cfg, st = info.scenario, info.config, info.settings
    first = results[0] if results else None
    lines = [f"# Simulation: {sc.trace}", ""]
    lines += [
        f"- Trace: `{sc.path}`. {sc.label or f'Read as the {sc.trace} format.'}",
        f"- Window: {_window(sc)}; {len(workload.jobs)} jobs submitted over "
        f"{_span(workload)}, simulated until {duration(st.drain_s)} after the last; "
        f"measured from {duration(st.warmup_s)} after the first"
        f"{f', for {duration(first.end - first.start)}' if first else ''}.",
        f"- Cluster: {len(workload.nodes)} nodes, {workload.capacity} GPUs. Offered load "
        f"(GPU time submitted, cut at the last submission, over capacity × window): "
        f"**{workload.offered_load():.2f}×** capacity.",
        _cpu_only_line(workload, profile["cpu_only"]),
        f"- Knobs: lookback {duration(cfg.lookback_window_s)}, minimum-runtime cap "
        f"{duration(cfg.max_min_runtime_s)}, tick {duration(st.tick_s)}, usage snapshot every "
        f"{duration(st.snapshot_s)}, stop grace {duration(st.stop_grace_s)} (free work "
        f"preempted for other work: {duration(cfg.free_stop_grace_s)}).",
        "",
        "## Summary",
        "",
        *markdown_table(*table(SUMMARY, results)),
        "",
        *_targets_line(sc.targets),
        "",
        *[f"- {m.policy}: {_verdict(m, sc.targets)}" for m in results],
        *_easy_note(workload, results),
        "",
        "## Definitions",
        "",
        "- **Occupancy**: GPU-seconds held by tasks (stopping ones included) ÷ (GPUs × window)."
        " *Of demand*: ÷ ∫ min(GPUs, held + asked for by waiting jobs) dt instead.",
        "- **Demand** of an allocation at a moment: GPUs its charged work (minimum runtime > 0)"
        " holds plus GPUs its waiting charged work asks for, if the cluster could ever run it.",
        "- **Owed** = ∫ min(entitlement × GPUs, demand) dt; **delivered** = ∫ GPUs its charged"
        " work holds dt, over the window. Owed delivered % = delivered ÷ owed (above 100% when"
        " a team used what others left idle). The summary shows the minimum over the teams"
        f" owed at least {SMALL_TEAM_OWED_FRACTION:.1%} of GPUs × window"
        " (`owed_delivered_min_pct`),"
        " over the window and (worst day) per day of it, with the floor taken per day; the"
        " teams under it apart (`owed_small_teams`: count, share of all owed, worst); and"
        " Σ min(delivered, owed) ÷ Σ owed over every team (`owed_delivered_weighted_pct`).",
        f"- **Enough demand**: demand ≥ entitlement × GPUs for at least "
        f"{st.enough_demand:.0%} of the window (marked * below; the minimum over those teams"
        " alone is `owed_delivered_min_enough_demand_pct` in metrics.json).",
        "- **Lost GPU-h**: GPU-hours of work a preemption threw away (since the job's last"
        " checkpoint; all of it for a job that cannot resume) ÷ (GPUs × window)."
        + (
            f" Resumable jobs checkpoint every {duration(st.checkpoint_s)}."
            if st.checkpoint_s
            else " Resumable jobs checkpoint when told to stop, so they lose nothing."
        ),
        "- **Started by size**: of the jobs asking for that many GPUs that the cluster could"
        " ever run, the share that started before the run ended.",
        "- **Queue wait**: submission to first start; jobs still waiting at the end count with"
        " their wait so far (a lower bound). **JCT**: submission to finish, finished jobs only."
        " **Slowdown**: JCT ÷ max(runtime, 10 s).",
        "- **Preemptions**: stops with cause *preempted* (a gang counts once).",
        "",
        *_mapping_section(info, workload, profile),
        *_allocations_section(results),
        *_waits_section(results),
        *_sizes_section(results),
        *_unstarted_section(results),
        *_outcomes_section(results),
    ]
    if plots:
        lines += ["## Plots", ""]
        lines += [f"![{p.stem}]({p.relative_to(out) if out else p})" for p in plots]
        lines.append("")
    return "\n".join(lines)


def _cpu_only_line(workload: Workload, cpu_only: dict[str, Any]) -> str:
    if not cpu_only["jobs"]:
        return "- CPU-only jobs: none in the trace."
    share = cpu_only["jobs"] / len(workload.jobs)
    return (
        f"- CPU-only jobs: **{cpu_only['jobs']}** of {len(workload.jobs)} ({share:.0%}, "
        f"{cpu_only['hours']:,.0f} job-hours). Quartermaster schedules GPU work: every "
        "policy rejects them (gpus must be at least 1); they count as *rejected* below and "
        "in no other metric."
    )


def _mapping_section(info: RunInfo, workload: Workload, profile: dict[str, Any]) -> list[str]:
    r, by_hash = info.scenario.rules, profile["placed_by_hash"]
    lines = ["## From trace jobs to Quartermaster jobs", ""]
    if workload.left_out:
        lines += [f"- **Left out**: {left_out_note(workload)}.", ""]
        lines += markdown_table(("job", "why"), [(j.job_id, j.why) for j in workload.left_out])
        lines += [""]
    if info.scenario.trace != "eventlog":
        lines += [
            "- **Team**: the one the trace names (a CSV row's `team`), else the budget-tree "
            "leaf whose `members` list the user, else, as a fallback, leaf number "
            f"⌊SHA-256(`{r.seed}`, `team`, user) ÷ 2⁶⁴ × leaves⌋ of the sorted leaves, the same "
            "for every job of that user on every run (Alibaba has no users: each pod draws "
            f"alone). **Placed by hash: {by_hash['jobs']} of {len(workload.jobs)} jobs, "
            f"{by_hash['users']} of {len({j.spec.user for j in workload.jobs})} users.**",
            f"- **Contract**, in order: best effort in the trace (Alibaba QoS BE) → unallocated "
            f"(minimum runtime 0); ≤ {DEBUG_MAX_GPUS} GPUs and runtime ≤ "
            f"{duration(r.debug_max_runtime_s)} → debug, minimum runtime = "
            f"min(runtime, {duration(DEBUG_MAX_MIN_RUNTIME_S)}); else, where the trace does not "
            f"say, a stable-hash draw below {r.unallocated_share:.0%} → unallocated; else "
            f"allocated, minimum runtime = min(runtime, the cap).",
            f"- **Resumable**: a stable-hash draw below {r.resumable_share:.0%}. **Priority** "
            "(used by the priority baseline, and within an allocation by the budget policy): "
            "Alibaba QoS (Guaranteed 2, LS 1, Burstable 0, BE -1); otherwise a stable-hash draw "
            + ", ".join(f"{p}: {s:.0%}" for p, s in r.priority_shares)
            + ".",
            "",
        ]
    lines += markdown_table(
        ("class", "jobs", "GPU-hours asked"),
        [(c, str(v["jobs"]), f"{v['gpu_h']:,.0f}") for c, v in profile["classes"].items()],
    )
    lines += [""]
    teams: Columns[tuple[str, dict[str, Any]]] = (
        ("team", lambda t: t[0]),
        ("entitlement", lambda t: f"{t[1]['entitlement']:.1%}"),
        ("users", lambda t: str(t[1]["users"])),
        ("jobs", lambda t: str(t[1]["jobs"])),
        ("charged GPU-hours asked", lambda t: f"{t[1]['charged_gpu_h']:,.0f}"),
    )
    return [*lines, *markdown_table(*table(teams, profile["teams"].items())), ""]


_ALLOCATION: Columns[AllocationMetrics] = (
    (
        "team",
        lambda a: a.name + (" *" if a.enough_demand else "") + (" (small)" if a.small_team else ""),
    ),
    ("entitlement", lambda a: f"{a.entitlement:.1%}"),
    ("time with enough demand", lambda a: f"{a.demand_fraction:.0%}"),
    ("owed", lambda a: f"{a.owed_gpu_h:,.0f}"),
    ("delivered", lambda a: f"{a.delivered_gpu_h:,.0f}"),
    ("delivered/owed", lambda a: _percent(a.delivered_pct)),
    ("unallocated run", lambda a: f"{a.free_gpu_h:,.0f}"),
)


def _allocations_section(results: Sequence[Metrics]) -> list[str]:
    lines = [
        "## Owed vs delivered per allocation",
        "",
        "GPU-hours over the window; * marks teams with enough demand, *(small)* those owed"
        f" under {SMALL_TEAM_OWED_FRACTION:.1%} of the cluster's GPU-hours (the headline's"
        " small teams).",
        "",
    ]
    for m in results:
        lines += [f"### {m.policy}", "", *markdown_table(*table(_ALLOCATION, m.allocations)), ""]
    return lines


_WAIT: Columns[tuple[Metrics, str]] = (  # a policy's jobs of a class
    ("policy", lambda mc: mc[0].policy),
    ("class", lambda mc: mc[1]),
    ("jobs", lambda mc: str(mc[0].waits[mc[1]].count)),
    ("wait p50", lambda mc: duration(mc[0].waits[mc[1]].p50)),
    ("wait p90", lambda mc: duration(mc[0].waits[mc[1]].p90)),
    ("wait p99", lambda mc: duration(mc[0].waits[mc[1]].p99)),
    ("JCT p50", lambda mc: duration(mc[0].jct[mc[1]].p50)),
    ("JCT p90", lambda mc: duration(mc[0].jct[mc[1]].p90)),
    ("slowdown p50", lambda mc: f"{mc[0].slowdown[mc[1]].p50:.1f}"),
    ("slowdown p90", lambda mc: f"{mc[0].slowdown[mc[1]].p90:.1f}"),
)


def _waits_section(results: Sequence[Metrics]) -> list[str]:
    by_class = [(m, c) for m in results for c in (*CLASSES, "all")]
    waits = markdown_table(*table(_WAIT, by_class))
    return ["## Waits, completion times and slowdown", "", *waits, ""]


_SIZE: Columns[tuple[Metrics, str]] = (  # a policy's jobs of a size class
    ("policy", lambda ms: ms[0].policy),
    ("GPUs", lambda ms: ms[1]),
    ("jobs", lambda ms: str(ms[0].waits_by_size[ms[1]].count)),
    ("started", lambda ms: _percent(ms[0].started_pct_by_size[ms[1]])),
    *(
        (f"started: {c}", lambda ms, c=c: _percent(ms[0].started_pct_by_size_and_class[c][ms[1]]))
        for c in CLASSES
    ),
    ("wait p50", lambda ms: duration(ms[0].waits_by_size[ms[1]].p50)),
    ("wait p90", lambda ms: duration(ms[0].waits_by_size[ms[1]].p90)),
    ("wait p99", lambda ms: duration(ms[0].waits_by_size[ms[1]].p99)),
)


def _sizes_section(results: Sequence[Metrics]) -> list[str]:
    by_size = [(m, size) for m in results for size in SIZES]
    return [
        "## Start rate and wait by job size",
        "",
        "Jobs submitted in the window that the cluster could ever run; waits of jobs still"
        " waiting at the end count so far. *Started* is also shown by work class: debug work"
        " (at most two GPUs) starts first, so it lifts the small sizes' figures.",
        "",
        *markdown_table(*table(_SIZE, by_size)),
        "",
    ]


# The large jobs that never started, listed per policy (metrics.json has them all).
UNSTARTED_SHOWN = 10
_UNSTARTED: Columns[Unstarted] = (
    ("job", lambda u: u.job_id),
    ("team", lambda u: u.allocation),
    ("GPUs", lambda u: str(u.gpus)),
    ("team's share (GPUs)", lambda u: f"{u.entitled_gpus:.0f}"),
    ("asked at", lambda u: duration(u.submitted_s)),
    ("waited", lambda u: duration(u.waited_s)),
    ("would have cost (GPU-h)", lambda u: f"{u.gpu_h:,.0f}"),
    ("team's work ahead (GPU-h)", lambda u: f"{u.ahead_gpu_h:,.0f}"),
    ("÷ team's share till the end", lambda u: f"{_behind(u):.1f}×"),
)


def _behind(u: Unstarted) -> float:
    """The team's work ahead of the job over what the team's share could run from when
    the job asked to the run's end: over 1, the share could not run that work in time."""
    if not u.ahead_gpu_h:
        return 0.0  # nothing ahead: behind nothing, even for a team with no share
    share = u.entitled_gpus * u.waited_s / 3600
    return u.ahead_gpu_h / share if share else math.inf


def _unstarted_section(results: Sequence[Metrics]) -> list[str]:
    """Per policy, the jobs over 64 GPUs that never started: when they asked, and what
    they would have cost."""
    lines = []
    for m in results:
        if not m.large_never_started:
            continue
        unstarted = m.large_never_started
        total = sum(u.gpu_h for u in unstarted)
        beyond = sum(u.gpus > u.entitled_gpus for u in unstarted)
        behind = sum(_behind(u) > 1 for u in unstarted)
        teams = Counter(u.allocation for u in unstarted)
        lines += [
            f"### {m.policy}: {len(unstarted)} job{'s' if len(unstarted) != 1 else ''} "
            "over 64 GPUs never started "
            f"({total:,.0f} GPU-hours of work)",
            "",
            f"By team: {', '.join(f'{t} {n}' for t, n in sorted(teams.items()))}; {beyond} "
            "asked for more than their team's share of the cluster; "
            f"{behind} had more of their team's work queued before them, when they asked, "
            "than the team's share could run by the end.",
            "",
            *markdown_table(*table(_UNSTARTED, list(unstarted[:UNSTARTED_SHOWN]))),
            "",
            *(
                [f"…and {len(unstarted) - UNSTARTED_SHOWN} more (`large_never_started`).", ""]
                if len(unstarted) > UNSTARTED_SHOWN
                else []
            ),
        ]
    if not lines:
        return []
    intro = (
        "Jobs that the cluster could run, submitted in the window, that never started: "
        "*asked at* is after the window's start; *team's share* is the most its team is ever "
        "owed; *team's work ahead* is the GPU-hours of its team's work of its class queued "
        "before it in the team's own order (priority, then submission) and not yet started "
        "when it asked (a lower bound: work requeued later is not counted); *÷ team's share "
        "till the end* divides that by the team's share × the time from its asking to the "
        "run's end (over 1×, that share could not run the work queued before it in time)."
    )
    return ["## Large jobs that never started", "", intro, "", *lines]


def _easy_note(workload: Workload, results: Sequence[Metrics]) -> list[str]:
    if not any(m.policy == "easy" for m in results):
        return []
    requested = sum(job.spec.runtime_estimate_s > 0 for job in workload.jobs)
    rest = len(workload.jobs) - requested
    return [
        "- easy: EASY backfill (FIFO; the head reserves the earliest GPUs its runtime"
        f" estimates free) estimated {requested:,} of {len(workload.jobs):,} jobs by the limit"
        " the trace requests"
        + (
            f", {rest:,} by their true runtime (known only to a simulator: its best case)."
            if rest
            else "."
        )
    ]


def _outcomes_section(results: Sequence[Metrics]) -> list[str]:
    outcomes = sorted({k for m in results for k in m.jobs})
    columns: Columns[Metrics] = (
        ("policy", lambda m: m.policy),
        *((k, lambda m, k=k: str(m.jobs.get(k, 0))) for k in outcomes),
        ("preempted (by class)", lambda m: ", ".join(f"{c} {n}" for c, n in m.preemptions.items())),
        ("requeues", lambda m: str(m.requeues)),
        ("lost GPU-hours", lambda m: f"{m.lost_gpu_h:,.0f}"),
        ("policy inputs", lambda m: str(m.inputs)),
    )
    return ["## Jobs at the end of the window", "", *markdown_table(*table(columns, results)), ""]


def _targets_line(t: Targets) -> list[str]:
    """The scenario's targets, in words, and what the summary's columns mean."""
    occupancy = f"occupancy ≥ {t.occupancy_pct:g}%; " if t.occupancy_pct is not None else ""
    return [
        f"Targets for this class of workload: the worst team ≥ {t.worst_team_pct:g}% of owed "
        f"delivered, over the teams owed at least {SMALL_TEAM_OWED_FRACTION:.1%} of the "
        "cluster's GPU-hours (the teams under that floor are *small teams*: how many, their "
        f"share of all owed, and their worst); weighted ≥ {t.weighted_pct:g}%; {occupancy}"
        f"debug p90 wait ≤ {duration(t.debug_p90_s)}; lost GPU-hours ≤ {t.lost_pct:g}% of "
        f"capacity; every size class that fits starting ≥ {t.size_rate:.0%} as often as "
        f"single-GPU jobs; ≤ {t.sim_cpu_s:g} s of simulator CPU. *Weighted*: Σ min(delivered, "
        "owed) ÷ Σ owed over every team. *Worst day*: the lowest owed delivered of any team "
        "on any day, the floor taken per day."
    ]


def _verdict(m: Metrics, t: Targets) -> str:
    checks: list[tuple[str, bool]] = [
        (
            "worst team",
            m.owed_delivered_min_pct is not None and m.owed_delivered_min_pct >= t.worst_team_pct,
        ),
        (
            "weighted",
            m.owed_delivered_weighted_pct is not None
            and m.owed_delivered_weighted_pct >= t.weighted_pct,
        ),
        *(
            [("occupancy", m.occupancy_pct >= t.occupancy_pct)]
            if t.occupancy_pct is not None
            else []
        ),
        ("debug p90 wait", m.waits["debug"].p90 <= t.debug_p90_s),
        ("lost GPU-hours", m.lost_gpu_h_pct <= t.lost_pct),
        ("start rate by size", _sizes_start_alike(m, t.size_rate)),
        ("sim CPU", m.sim_cpu_s <= t.sim_cpu_s),
    ]
    verdict = ", ".join(f"{name} {'met' if ok else 'missed'}" for name, ok in checks)
    return f"{verdict} (occupancy of demand {m.occupancy_of_demand_pct:.1f}%)"


def _sizes_start_alike(m: Metrics, rate: float) -> bool:
    """Every size class with jobs starts at least ``rate`` of the single-GPU rate."""
    single = m.started_pct_by_size["1"]
    if single is None:
        return True
    rates = (r for r in m.started_pct_by_size.values() if r is not None)
    return all(r >= rate * single for r in rates)


def _span(workload: Workload) -> str:
    jobs = workload.jobs
    return duration(jobs[-1].at - jobs[0].at) if jobs else "nothing"


def _window(sc: Scenario) -> str:
    parts = [f"the first {sc.skip_head} jobs skipped"] if sc.skip_head else []
    if sc.start_s is not None:
        parts.append(f"submitted from {sc.start_s:g} s")
    if sc.end_s is not None:
        parts.append(f"submitted before {sc.end_s:g} s")
    return ", ".join(parts) or "the whole trace"
