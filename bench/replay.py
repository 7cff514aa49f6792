"""Replay on the shipped math, code and swe tasks: observations reproduced and rewards, in one run.

    python -m bench.replay

One real service (``LocalCluster``, bubblewrap sandboxes, a scripted LLM server) runs one job of
each shipped task family with tools: math with the python tool (8 turns building IPython state),
the code problem ``code-001`` (editor, ten bash runs, finish: 12 turns) and the swe instance
``prorl-swe__romanum-14`` (view, edit, run, finish). Each finished job is then replayed
(``POST /jobs/replay``): a fresh sandbox, the recorded model outputs, EVAL again. Reported per
task: observations checked and reproduced, the reward then and now, and the LLM requests the
replays made (none may be). Target: 100 % of observations reproduced, the same rewards.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._cli import markdown_table, run_benchmark
from bench.fork import REPLIES as CODE_REPLIES
from bench.resume import ANSWER
from bench.resume import REPLIES as MATH_REPLIES
from bench.resume import TURNS as MATH_TURNS
from prorl_celery.dev.scripted_agents import ROMANUM_FIX

RESULTS = Path(__file__).parent / "results" / "replay.json"
ROMANUM_ID = "prorl-swe__romanum-14"



def main(argv: list[str] | None = None) -> int:
    if shutil.which("bwrap") is None:
        print("bubblewrap (bwrap) is needed: apt-get install bubblewrap", file=sys.stderr)
        return 1
    return run_benchmark(run, report, RESULTS, lambda r: all(
        t["reproduced"] == t["checked"] and t["reward_then"] == t["reward_now"] for t in r["tasks"].values())
        and r["replay_llm_requests"] == 0)


def run() -> dict[str, Any]:
    import httpx

    from handlers.swe import load_instances
    from prorl_celery.core.status import Stage
    from prorl_celery.dev.devmodels import ensure_tokenizer
    from prorl_celery.dev.local import LocalCluster

    tokenizer = str(ensure_tokenizer("qwen3"))
    root = Path(tempfile.mkdtemp(prefix="prorl-bench-replay-"))
    rules = root / "rules.json"
    rules.write_text(json.dumps([
        {"match": "BENCH-RESUME", "scope": "prompt", "replies": MATH_REPLIES},
        {"match": "BENCH-FORK", "scope": "prompt", "replies": CODE_REPLIES},
        {"match": "to_roman\\(\\) writes nine hundreds as DCD", "scope": "prompt", "replies": ROMANUM_FIX}]))
    problems = Path(__file__).resolve().parents[1] / "handlers" / "code" / "data" / "problems.jsonl"
    code = next(json.loads(line) for line in problems.read_text().splitlines() if '"code-001"' in line)
    code.pop("id")
    swe = next(row for row in load_instances() if row["instance_id"] == ROMANUM_ID)
    instances = {
        "math": {"data_source": "math", "problem": f"BENCH-RESUME job 0: x after {MATH_TURNS - 1} steps?",
                 "answer": ANSWER, "tools": ["python"], "max_iterations": MATH_TURNS},
        "code": {**code, "data_source": "codeforces", "problem": f"[BENCH-FORK replay] {code['problem']}",
                 "max_iterations": 12},
        "swe": {**swe, "data_source": "swe_bench"}}
    env = {"PRORL_RUNTIME": "bubblewrap", "PRORL_NODE": f"bench-replay-{os.getpid()}",
           "PRORL_SANDBOX_DIR": str(root / "sbx")}
    command = [sys.executable, "-m", "prorl_celery.dev.llm_server", "--scripted", str(rules), "--tokenizer",
               tokenizer, "--port", "{port}"]
    with LocalCluster(tokenizer=tokenizer, llm_command=command, env=env, gateway_workers=1, log_dir=root,
                      concurrency={Stage.INIT: 3, Stage.RUN: 4, Stage.EVAL: 3}) as cluster, \
            httpx.Client(base_url=cluster.gateway_url, timeout=600) as gateway:
        assert cluster.llm_url is not None
        llm = cluster.llm_url.removesuffix("/v1")
        assert gateway.post("/add_llm_server", json={"address": cluster.llm_url}).status_code == 200
        ids = {task: gateway.post("/jobs", json={"instance": instance}).json()["job_id"]
               for task, instance in instances.items()}
        sources = {task: _wait(gateway, job_id) for task, job_id in ids.items()}
        asked = len(httpx.get(llm + "/_log", timeout=60).json())
        started = time.monotonic()
        replays = gateway.post("/jobs/replay", json={"job_ids": list(ids.values())}).json()["jobs"]
        results = {task: _wait(gateway, entry["job_id"]) for task, entry in zip(ids, replays)}
        replay_s = time.monotonic() - started
        asked_after = len(httpx.get(llm + "/_log", timeout=60).json())
    tasks = {}
    for task, result in results.items():
        report = result.get("replay") or {}
        checked = int(report.get("observations_checked") or 0)
        tasks[task] = {"status_then": sources[task]["status"], "status_now": result["status"],
                       "turns": report.get("turns_replayed"), "checked": checked,
                       "reproduced": checked - int(report.get("observations_differing") or 0),
                       "reward_then": report.get("reward_then"), "reward_now": report.get("reward_now"),
                       "differences": report.get("differences")}
    return {"tasks": tasks, "replay_llm_requests": asked_after - asked, "replay_wall_s": replay_s,
            "log_dir": str(root)}


def _wait(gateway: Any, job_id: str) -> dict[str, Any]:
    while True:
        answer = gateway.get(f"/jobs/{job_id}", params={"wait": 60})
        if answer.status_code == 200:
            return answer.json()


def report(result: dict[str, Any]) -> str:
    rows = [[task, str(t["turns"]), str(t["checked"]),
             f"{t['reproduced']} ({100 * t['reproduced'] / max(1, t['checked']):.0f} %)",
             str(t["reward_then"]), str(t["reward_now"]), f"{t['status_then']} / {t['status_now']}"]
            for task, t in result["tasks"].items()]
    return "\n".join([
        "replay: one job of each shipped task with tools, then its replay (fresh sandbox, recorded model outputs)",
        "", *markdown_table(["task", "turns", "observations checked", "reproduced", "reward then", "reward now",
                             "status then / now"], rows), "",
        f"LLM requests made by the replays: {result['replay_llm_requests']}; the three replays took "
        f"{result['replay_wall_s']:.1f} s"])


if __name__ == "__main__":
    raise SystemExit(main())
