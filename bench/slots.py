"""More rollouts than RUN slots: how long a freed slot stays idle before the next queued stage.

A RUN worker of ``--slots`` slots (``-c`` = ``PRORL_RUN_SLOTS``) gets ``--jobs-per-slot`` times
as many one-turn math jobs as it has slots, all submitted at once (``bench.burst``'s batched
style), each LLM call taking ``--delay`` s at the scripted server. Every slot runs one job after
another, so the ideal makespan is ``ceil(jobs / slots) x delay``; what a slot loses between two
jobs shows as the gap from one LLM answer to the next request's arrival at the LLM server
(its request log; the k-th answer's slot is the one the (slots + k)-th request arrives in, as
the jobs all wait in one FIFO queue). That gap spans the end of one RUN stage, the hand-over of
the slot to the next message and the start of the next stage, so it bounds the slot's idle time
from above. Also reported: the RUN worker's CPU over a few idle seconds after the burst (a
worker waiting for work must not spin).

    python -m bench.slots                                  # 8 and 32 slots, 10 jobs per slot, 1 s
    python -m bench.slots --slots 8 --baseline /tmp/slots-base --repeat 2

With ``--baseline TREE`` (``git archive main | tar -x -C /tmp/slots-base``) every round runs a
cluster of that tree and one of this tree, order alternating, and the report gives this tree's
makespan and mean gap over the baseline's. Writes ``bench/results/slots.json``.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench._cli import machine_note, markdown_table, run_benchmark
from bench.burst import Plan, batched, group_cpu_s, llm_base, named, run_async, start_cluster, start_run, trees_of
from prorl_celery.dev.local import LocalCluster

RESULTS = Path(__file__).resolve().parent / "results" / "slots.json"
#: the targets: makespan within this of the ideal, and a freed slot busy again within this (mean)
TARGET_RATIO = 1.15
TARGET_GAP_S = 0.1
IDLE_S = 5.0


def parse_args(argv: list[str] | None) -> tuple[Plan, list[int], int]:
    parser = argparse.ArgumentParser(prog="python -m bench.slots", description=__doc__.split("\n\n")[0])
    parser.add_argument("--slots", default="8,32", help="RUN slots (= RUN -c) of each cluster (default %(default)s)")
    parser.add_argument("--jobs-per-slot", type=int, default=10)
    parser.add_argument("--delay", type=float, default=1.0, help="seconds of one LLM call (default %(default)s)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds (trees alternate their order)")
    parser.add_argument("--baseline", help="a tree of an older service to run beside this one")
    args = parser.parse_args(argv)
    plan = Plan(sizes=[], styles=["batched"], delay_s=args.delay, warm_delay_s=0.2, repeat=args.repeat,
                run_concurrency=None, init_concurrency=16, eval_concurrency=16, gateway_workers=2,
                gateway_threads=None, warmup=True,
                baseline=str(Path(args.baseline).resolve()) if args.baseline else None)
    return plan, [int(s) for s in args.slots.split(",")], args.jobs_per_slot


def slot_gaps(log: list[dict[str, Any]], slots: int) -> list[float]:
    """From each LLM answer to the arrival of the request that took its slot (FIFO pairing)."""
    starts = sorted(g["started"] for g in log)
    ends = sorted(g["finished"] or g["started"] for g in log)
    return [starts[slots + k] - ends[k] for k in range(len(starts) - slots)]


def measure(cluster: LocalCluster, plan: Plan, slots: int, jobs: int, tag: str) -> dict[str, Any]:
    httpx.post(llm_base(cluster) + "/_reset").raise_for_status()
    run_worker = named(cluster, "run-")
    cpu_before = group_cpu_s(run_worker)
    makespan, results = run_async(batched(cluster, jobs, tag, []))
    cpu_run = group_cpu_s(run_worker) - cpu_before
    log = httpx.get(llm_base(cluster) + "/_log", timeout=120).json()
    time.sleep(0.5)  # the last EVAL hand-overs
    idle_before = group_cpu_s(run_worker)
    time.sleep(IDLE_S)
    idle_cpu = (group_cpu_s(run_worker) - idle_before) / IDLE_S
    gaps = slot_gaps(log, slots)
    ideal = math.ceil(jobs / slots) * plan.delay_s
    bad = [r for r in results if r.get("status") != "completed"]
    row = {"slots": slots, "jobs": jobs, "makespan_s": makespan, "ideal_s": ideal, "ratio": makespan / ideal,
           "gap_mean_s": statistics.fmean(gaps) if gaps else None,
           "gap_median_s": statistics.median(gaps) if gaps else None,
           "gap_p90_s": statistics.quantiles(gaps, n=10)[-1] if len(gaps) > 1 else None,
           "gap_max_s": max(gaps) if gaps else None, "llm_requests": len(log),
           "run_cpu_ms_per_job": cpu_run * 1e3 / jobs, "run_idle_cpu_ms_per_s": idle_cpu * 1e3,
           "not_completed": len(bad)}
    print(f"  {slots:>3} slots, {jobs:>4} jobs: makespan {makespan:6.2f} s ({row['ratio']:.2f}x the ideal "
          f"{ideal:g} s), slot gap mean {row['gap_mean_s'] or 0:.3f} s, p90 {row['gap_p90_s'] or 0:.3f} s, "
          f"max {row['gap_max_s'] or 0:.3f} s; RUN idle CPU {row['run_idle_cpu_ms_per_s']:.1f} ms/s"
          + (f", {len(bad)} not completed" if bad else ""), file=sys.stderr, flush=True)
    return row


def run(plan: Plan, slot_counts: list[int], per_slot: int) -> dict[str, Any]:
    result, log_dir, tokenizer, rules = start_run(
        "slots", plan, {**plan.__dict__, "slots": slot_counts, "jobs_per_slot": per_slot})
    trees = trees_of(plan)
    for slots in slot_counts:
        for round_ in range(plan.repeat):
            for label, tree in (trees if round_ % 2 == 0 else trees[::-1]):
                plan.run_concurrency = slots
                print(f"{slots} slots, round {round_}, {label} tree ({tree})", file=sys.stderr, flush=True)
                here = os.getcwd()
                os.chdir(tree)  # `python -m` puts the working directory first on sys.path: the tree's own
                try:
                    cluster = start_cluster(plan, slots, log_dir / f"s{slots}-r{round_}-{label}", tokenizer,
                                            rules, tree)
                finally:
                    os.chdir(here)
                try:
                    time.sleep(2.0)  # tokenizer preload, first heartbeat
                    run_async(batched(cluster, 2 * slots, "BURSTWARM", []))
                    row = measure(cluster, plan, slots, slots * per_slot, f"BURST r{round_}")
                    row.update(round=round_, tree=label)
                    result["rows"].append(row)
                finally:
                    cluster.stop()
    result["loadavg_after"] = os.getloadavg()
    return result


def report(result: dict[str, Any]) -> str:
    plan = result["plan"]
    lines = [f"{plan['jobs_per_slot']} one-turn math jobs per RUN slot, LLM call {plan['delay_s']:g} s, "
             + machine_note(result), ""]
    lines += markdown_table(
        ["tree", "slots", "jobs", "makespan", "ideal", "/ ideal", "slot gap mean", "median", "p90", "max",
         "RUN CPU/job", "RUN idle CPU", "not completed"],
        [[f"{r['tree']} r{r['round']}", str(r["slots"]), str(r["jobs"]), f"{r['makespan_s']:.2f} s",
          f"{r['ideal_s']:g} s", f"{r['ratio']:.2f}x", f"{r['gap_mean_s']:.3f} s", f"{r['gap_median_s']:.3f} s",
          f"{r['gap_p90_s']:.3f} s", f"{r['gap_max_s']:.3f} s", f"{r['run_cpu_ms_per_job']:.1f} ms",
          f"{r['run_idle_cpu_ms_per_s']:.1f} ms/s", str(r["not_completed"])] for r in result["rows"]])
    rows = {(r["slots"], r["round"], r["tree"]): r for r in result["rows"]}
    versus = [(key, row, rows.get((key[0], key[1], "baseline"))) for key, row in sorted(rows.items())
              if key[2] == "this"]
    if any(other for _, _, other in versus):
        lines.append("")
        lines.append("this tree against the baseline, same round:")
        for (slots, round_, _), row, other in versus:
            if other:
                lines.append(f"  {slots:>3} slots r{round_}: makespan {row['makespan_s']:.2f} vs "
                             f"{other['makespan_s']:.2f} s = {row['makespan_s'] / other['makespan_s']:.2f}x; "
                             f"mean slot gap {row['gap_mean_s']:.3f} vs {other['gap_mean_s']:.3f} s")
    return "\n".join(lines)


def passed(result: dict[str, Any]) -> bool:
    return all(r["ratio"] <= TARGET_RATIO and r["gap_mean_s"] <= TARGET_GAP_S and not r["not_completed"]
               for r in result["rows"] if r["tree"] == "this")


def main(argv: list[str] | None = None) -> int:
    plan, slot_counts, per_slot = parse_args(argv)
    return run_benchmark(lambda: run(plan, slot_counts, per_slot), report, RESULTS, passed)


if __name__ == "__main__":
    sys.exit(main())
