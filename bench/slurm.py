"""bench.slurm: the service under ``sbatch deploy/slurm/prorl.sbatch`` on a real Slurm cluster.

The cluster is ``tests/support/slurm.py``'s: munge, slurmctld and three slurmd, each node a
network namespace (one node where namespaces cannot be made: the report says which). Measured:

- sbatch to the gateway answering ``/healthz``, and to every worker's first heartbeat;
- ``--jobs`` node-local jobs (INIT, then RUN on the same node for ``--run-s``, then EVAL) on
  three nodes: RUN stages per node (balance: the smallest share over the largest) and jobs per
  second, against the same jobs on a one-node allocation of the same script, measured in the
  same run (the baseline: the ratio is the point, the absolute numbers move with the machine);
- a drain during a run: jobs lost (none may be) and seconds from the drain to ``drained``;
- ``scancel`` with jobs in flight: seconds until no process is left in any node, and how the
  jobs ended (read from Redis's file afterwards).

    python -m bench.slurm                 # about 3 minutes on 2 cores
    python -m bench.slurm --jobs 60       # smoke
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench._cli import run_benchmark
from prorl_celery.dev.local import wait_until
from tests.support.slurm import (
    Service,
    SlurmCluster,
    allocation_processes,
    service_env,
    statuses_on_disk,
    wait_for_job,
)

RESULTS = Path(__file__).parent / "results" / "slurm.json"
#: per node, the same in both allocations: RUN slots bound the throughput of these jobs
POOLS = {"INIT_WORKERS": "4", "RUN_WORKERS": "8", "EVAL_WORKERS": "2"}


def job(index: int, run_s: float, **extra: Any) -> dict[str, Any]:
    return {"instance": {"data_source": "localfault", "instance_id": f"b{index}", "init_sleep_s": 0.05,
                         "run_sleep_s": run_s, **extra}}


def throughput(service: Service, jobs: int, run_s: float) -> dict[str, Any]:
    started = time.monotonic()
    ids = [r["job_id"] for r in service.http.post("/jobs", json=[job(i, run_s) for i in range(jobs)]).json()["jobs"]]
    results = service.results(ids, 600)
    elapsed = time.monotonic() - started
    ended = Counter(r["status"] for r in results.values())
    per_node = Counter(r["nodes"]["run"] for r in results.values() if r["status"] == "completed")
    affine = sum(r["nodes"]["run"] == r["nodes"]["init"] for r in results.values())
    return {"jobs": jobs, "seconds": round(elapsed, 2), "jobs_per_s": round(jobs / elapsed, 2),
            "ended": dict(ended), "run_per_node": dict(sorted(per_node.items())), "node_affine": affine,
            "balance": round(min(per_node.values()) / max(per_node.values()), 3) if per_node else 0.0}


def drain(service: Service, victim: str, run_s: float) -> dict[str, Any]:
    ids = [r["job_id"] for r in service.http.post("/jobs", json=[job(1000 + i, run_s) for i in range(60)]
                                                  ).json()["jobs"]]
    wait_until(lambda: service.nodes()[victim]["busy"] > 0, 60, f"a stage on {victim}")
    asked = time.monotonic()
    service.http.post(f"/nodes/{victim}/drain").raise_for_status()
    wait_until(lambda: service.nodes()[victim]["state"] == "drained", 120, f"{victim} drained")
    drained_s = time.monotonic() - asked
    results = service.results(ids, 300)
    service.http.post(f"/nodes/{victim}/undrain").raise_for_status()
    lost = sum(r["status"] != "completed" or r["attempt"] != 1 for r in results.values())
    return {"jobs": len(ids), "drained_s": round(drained_s, 1), "lost_or_retried": lost,
            "on_victim": sum(r["nodes"]["init"] == victim for r in results.values())}


def scancel(slurm: SlurmCluster, service: Service, work: Path) -> dict[str, Any]:
    ids = [r["job_id"] for r in service.http.post("/jobs", json=[job(2000 + i, 60, sandbox=i % 2 == 0)
                                                                 for i in range(12)]).json()["jobs"]]
    wait_until(lambda: sum(n["busy"] for n in service.nodes().values()) >= 3, 60, "jobs in RUN")
    cancelled = time.monotonic()
    slurm.run("scancel", service.job)
    while allocation_processes(slurm, service.job):
        if time.monotonic() - cancelled > 120:
            raise RuntimeError(f"processes left 120 s after scancel: {allocation_processes(slurm, service.job)}")
        time.sleep(0.1)
    gone_s = time.monotonic() - cancelled
    wait_for_job(slurm, service.job, {"CANCELLED", "GONE"}, 60)
    return {"jobs_in_flight": len(ids), "no_process_s": round(gone_s, 1),
            "ended": dict(Counter(statuses_on_disk(work / "redis", ids, work).values()))}


def run(jobs: int, run_s: float) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
    with SlurmCluster(work / "slurm", 3) as slurm:
        env = service_env(slurm, work, **POOLS)
        result: dict[str, Any] = {"layout": slurm.layout, "nodes": len(slurm.nodes), "pools_per_node": POOLS,
                                  "run_s": run_s, "work": str(work)}
        three = Service(slurm, env, work)
        result["sbatch_to_gateway_s"] = round(three.up_s, 1)
        result["sbatch_to_all_workers_s"] = round(three.ready_s, 1)
        result["three_nodes"] = throughput(three, jobs, run_s)
        if len(slurm.nodes) > 1:
            result["drain"] = drain(three, slurm.nodes[-1].name, run_s)
        result["scancel"] = scancel(slurm, three, work)
        one = Service(slurm, env, work, nodes=1)
        result["one_node"] = throughput(one, jobs, run_s)
        slurm.run("scancel", one.job)
        wait_for_job(slurm, one.job, {"CANCELLED", "GONE"}, 60)
        result["speedup"] = round(result["three_nodes"]["jobs_per_s"] / result["one_node"]["jobs_per_s"], 2)
    return result


def report(r: dict[str, Any]) -> str:
    three, one = r["three_nodes"], r["one_node"]
    lines = [f"layout {r['layout']} ({r['nodes']} nodes), pools per node {r['pools_per_node']}, RUN {r['run_s']} s",
             f"sbatch -> gateway answering {r['sbatch_to_gateway_s']} s, -> every worker beating "
             f"{r['sbatch_to_all_workers_s']} s",
             f"{three['jobs']} jobs on {r['nodes']} nodes: {three['jobs_per_s']} jobs/s, RUN per node "
             f"{three['run_per_node']} (balance {three['balance']}), node-affine {three['node_affine']}, "
             f"ended {three['ended']}",
             f"same jobs on 1 node: {one['jobs_per_s']} jobs/s, ended {one['ended']}; speed-up {r['speedup']}x"]
    if "drain" in r:
        d = r["drain"]
        lines.append(f"drain during a run of {d['jobs']} jobs ({d['on_victim']} on the node): drained after "
                     f"{d['drained_s']} s, lost or retried {d['lost_or_retried']}")
    s = r["scancel"]
    lines.append(f"scancel with {s['jobs_in_flight']} jobs in flight: no process left after {s['no_process_s']} s; "
                 f"jobs ended {s['ended']}")
    return "\n".join(lines)


def passed(r: dict[str, Any]) -> bool:
    """Every job completed and node-affine, the drain lost nothing, scancel left every job ended."""
    three, one = r["three_nodes"], r["one_node"]
    ok = three["ended"] == {"completed": three["jobs"]} and one["ended"] == {"completed": one["jobs"]}
    ok = ok and three["node_affine"] == three["jobs"]
    ok = ok and r.get("drain", {}).get("lost_or_retried", 0) == 0
    return ok and set(r["scancel"]["ended"]) == {"cancelled"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--run-s", type=float, default=1.0)
    args = parser.parse_args()
    return run_benchmark(lambda: run(args.jobs, args.run_s), report, RESULTS, passed)


if __name__ == "__main__":
    sys.exit(main())
