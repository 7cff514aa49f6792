"""Crash resume from the per-turn journal against restarting from turn zero, in one run.

    python -m bench.resume                  # 20 jobs of 8 turns, the RUN worker killed halfway
    python -m bench.resume --jobs 10 --delay 0.3

Both sides run the same real service (``LocalCluster``: gunicorn, INIT/RUN/EVAL workers, a
scripted LLM server answering each turn after ``--delay`` s, bubblewrap sandboxes) on the same
jobs: math problems with the python tool whose 8 turns build on each other's IPython state. When
every job has started and the median one has had half of its turns served, the RUN worker is
SIGKILLed and another started (jobs that ended before are counted, not retried);
the lease reaper retries each job from INIT. With the journal (``PRORL_JOURNAL=true``) RUN replays
the journaled turns on the fresh sandbox and goes on; without it (``false``: today's behaviour)
every turn is generated again. From the LLM server's own request log: the model tokens generated
in all, and those of a turn generated a second time (same prompt asked twice: only the turn in
flight at the kill may be, with the journal); each job's model turns checked id for id against
what the server generated; time from the kill until every job ended, and until each job's first
request after the kill (resume's first live turn, against restart's turn 1).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench._cli import markdown_table, run_benchmark
from handlers.tool_calls import tool_call

RESULTS = Path(__file__).parent / "results" / "resume.json"
TURNS = 8  # the math family's cap on max_iterations
ANSWER = str(2 ** (TURNS - 1) - 1)


def python_call(code: str) -> str:
    return tool_call("python", code=code)


REPLIES = [python_call("x = 1\nprint(x)")] + [python_call("x = 2 * x + 1\nprint(x)")] * (TURNS - 2) + \
    [f"The answer is \\boxed{{{ANSWER}}}."]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.resume", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20, help="jobs in flight when the RUN worker is killed")
    parser.add_argument("--kills", type=int, default=1, help="RUN worker kills: the first halfway, each next one "
                        "0.5 to 3 s (at random, seeded) after RUN serves again, while jobs are left")
    parser.add_argument("--delay", type=float, default=1.0, help="seconds the LLM server takes per turn")
    args = parser.parse_args(argv)
    if shutil.which("bwrap") is None:
        print("bubblewrap (bwrap) is needed: apt-get install bubblewrap", file=sys.stderr)
        return 1
    return run_benchmark(lambda: run(args), report, RESULTS, _passed)


def _passed(result: dict[str, Any]) -> bool:
    journal = result["sides"]["journal"]
    return (journal["completed"] == result["jobs"] and journal["exact_jobs"] == result["jobs"]
            and journal["journaled_tokens_regenerated"] == 0
            and journal["jobs_asked_again_more_than_once_per_kill"] == 0 and result["tokens_ratio"] < 1.0)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from prorl_celery.dev.devmodels import ensure_tokenizer
    tokenizer = str(ensure_tokenizer("qwen3"))
    root = Path(tempfile.mkdtemp(prefix="prorl-bench-resume-"))
    rules = root / "rules.json"
    rules.write_text(json.dumps([{"match": "BENCH-RESUME", "scope": "prompt", "replies": REPLIES,
                                  "delay_s": args.delay}]))
    sides = {side: _side(side, args, tokenizer, rules, root / side) for side in ("journal", "restart")}
    journal, restart = sides["journal"], sides["restart"]
    return {"jobs": args.jobs, "turns": TURNS, "delay_s": args.delay, "sides": sides,
            "tokens_ratio": journal["tokens_generated"] / max(1, restart["tokens_generated"]),
            "tokens_saved": restart["tokens_generated"] - journal["tokens_generated"],
            "end_ratio": journal["kill_to_all_ended_s"] / max(1e-9, restart["kill_to_all_ended_s"]),
            "log_dir": str(root)}


def _side(side: str, args: argparse.Namespace, tokenizer: str, rules: Path, log_dir: Path) -> dict[str, Any]:
    import httpx
    from transformers import AutoTokenizer

    from prorl_celery.core.status import Stage
    from prorl_celery.dev.local import LocalCluster, wait_until

    decoder = AutoTokenizer.from_pretrained(tokenizer)
    env = {"PRORL_JOURNAL": "true" if side == "journal" else "false", "PRORL_RUNTIME": "bubblewrap",
           "PRORL_NODE": f"bench-resume-{side}-{os.getpid()}", "PRORL_SANDBOX_DIR": str(log_dir / "sbx"),
           "PRORL_LEASE_S": "3", "PRORL_REAPER_INTERVAL_S": "0.5", "PRORL_VISIBILITY_TIMEOUT_S": "10",
           "PRORL_SHUTDOWN_GRACE_S": "1"}
    command = [sys.executable, "-m", "prorl_celery.dev.llm_server", "--scripted", str(rules), "--tokenizer",
               tokenizer, "--port", "{port}"]
    run_slots = max(8, args.jobs)
    with LocalCluster(tokenizer=tokenizer, llm_command=command, env=env, gateway_workers=1, log_dir=log_dir,
                      concurrency={Stage.INIT: 4, Stage.RUN: run_slots, Stage.EVAL: 2}) as cluster:
        assert cluster.llm_url is not None
        llm = cluster.llm_url.removesuffix("/v1")
        with httpx.Client(base_url=cluster.gateway_url, timeout=300) as gateway:
            assert gateway.post("/add_llm_server", json={"address": cluster.llm_url}).status_code == 200
            jobs = []
            for n in range(args.jobs):
                instance = {"data_source": "math", "problem": f"BENCH-RESUME job {n}: x after {TURNS - 1} steps?",
                            "answer": ANSWER, "tools": ["python"], "max_iterations": TURNS}
                reply = gateway.post("/jobs", json={"instance": instance, "max_attempts": min(10, args.kills + 1)})
                jobs.append(reply.json()["job_id"])

            def served() -> dict[int, list[dict]]:
                by_job: dict[int, list[dict]] = {}
                for request in httpx.get(llm + "/_log", timeout=60).json():
                    text = decoder.decode(request["prompt_ids"])
                    marker = text.split("BENCH-RESUME job ", 1)
                    if len(marker) == 2:
                        by_job.setdefault(int(marker[1].split(":", 1)[0]), []).append(request)
                return by_job

            def halfway() -> bool:  # every job started, the median one halfway
                log = served()
                done = [len([r for r in log.get(n, []) if r["finished"]]) for n in range(args.jobs)]
                return min(done) >= 1 and statistics.median(done) >= TURNS // 2
            wait_until(halfway, 600, "every job started, the median one halfway")
            def kill_run_worker() -> None:
                victim = next(p for p in cluster.processes if p.name.startswith(Stage.RUN.value + "-"))
                os.kill(victim.popen.pid, signal.SIGKILL)
                victim.popen.wait(30)
                cluster.processes.remove(victim)
                cluster.start_worker(Stage.RUN, run_slots)
            before = {n: len(requests) for n, requests in served().items()}
            kill_run_worker()
            killed = time.monotonic()
            kills, chance = 1, random.Random(26)
            served_at_kill, rearmed = sum(before.values()), None
            first_after: dict[int, float] = {}
            results = {}
            while len(results) < len(jobs):
                # the next kill: once RUN serves again (half as many requests as jobs since the last
                # kill), after 0.5 to 3 s more at random, while jobs are left
                total = sum(len(v) for v in served().values())
                if kills < args.kills and rearmed is None and total - served_at_kill >= args.jobs // 2:
                    rearmed = time.monotonic() + chance.uniform(0.5, 3.0)
                if rearmed is not None and time.monotonic() > rearmed:
                    kill_run_worker()
                    kills, served_at_kill, rearmed = kills + 1, total, None
                log = served()
                now = time.monotonic()
                for n in range(args.jobs):
                    if n not in first_after and len(log.get(n, [])) > before.get(n, 0):
                        first_after[n] = now - killed
                for n, job_id in enumerate(jobs):
                    if n not in results:
                        answer = gateway.get(f"/jobs/{job_id}", params={"wait": 0})
                        if answer.status_code == 200:
                            results[n] = answer.json()
                if now - killed > 600:
                    raise TimeoutError("jobs did not end within 600 s of the kill")
                time.sleep(0.2)
            ended = time.monotonic() - killed
            log = served()
    tokens = sum(len(r["output_ids"]) for requests in log.values() for r in requests)
    regenerated = exact = over = 0
    for n, result in results.items():
        asked = Counter(tuple(r["prompt_ids"]) for r in log.get(n, []))
        # each kill may cost a job the one turn it had in flight (never returned, never journaled)
        over += sum(count - 1 for count in asked.values()) > kills
        trajectory = result.get("trajectory") or {}
        journaled = {t["context_len"] for t in trajectory.get("turns", [])[:((result.get("resume") or {})
                                                                            .get("from_turn") or 0)]}
        if kills == 1:  # with one kill, a journaled turn asked twice is one generated again
            regenerated += sum(len(r["output_ids"]) for r in log.get(n, [])
                               if asked[tuple(r["prompt_ids"])] > 1 and len(r["prompt_ids"]) in journaled)
        exact += _exact(trajectory, log.get(n, []))
    resumed = [r.get("resume") or {} for r in results.values()]
    return {"kills": kills, "jobs_asked_again_more_than_once_per_kill": over,
            "attempts": dict(sorted(Counter(r["attempt"] for r in results.values()).items())),
            "in_flight_at_kill": sum(r["attempt"] >= 2 for r in results.values()),
            "completed": sum(r["status"] == "completed" and r["reward"] == 1.0 for r in results.values()),
            "resumed": sum(bool(r.get("resumed")) for r in resumed),
            "replayed_turns": sum(int(r.get("replayed_turns") or 0) for r in resumed),
            "tokens_generated": tokens, "requests": sum(len(v) for v in log.values()),
            "journaled_tokens_regenerated": regenerated, "exact_jobs": exact,
            "kill_to_all_ended_s": ended,
            # how each job that did not resume went: its attempt and its resume field
            "not_resumed": [[r["attempt"], r.get("resume")] for r in results.values()
                            if not (r.get("resume") or {}).get("resumed")],
            "kill_to_first_request_p50_s": statistics.median(first_after.values()) if first_after else None}


def _exact(trajectory: dict[str, Any], requests: list[dict]) -> bool:
    """Is every model turn of the trajectory what the server generated for that context?"""
    by_prompt = {tuple(r["prompt_ids"]): r["output_ids"] for r in requests if r["finished"] and not r["aborted"]}
    context = trajectory.get("prompt_ids", []) + trajectory.get("response_ids", [])
    for turn in trajectory.get("turns", []):
        start = len(trajectory["prompt_ids"]) + turn["output_start"]
        if by_prompt.get(tuple(context[:turn["context_len"]])) != context[start:start + turn["output_len"]]:
            return False
    return bool(trajectory.get("turns"))


def report(result: dict[str, Any]) -> str:
    rows = []
    for side in ("journal", "restart"):
        s = result["sides"][side]
        rows.append([side, f"{s['completed']}/{result['jobs']}", str(s["in_flight_at_kill"]), str(s["resumed"]),
                     str(s["requests"]),
                     str(s["tokens_generated"]),
                     str(s["journaled_tokens_regenerated"]) if s["kills"] == 1 else "n/a (see below)",
                     f"{s['exact_jobs']}",
                     f"{s['kill_to_first_request_p50_s']:.2f}" if s["kill_to_first_request_p50_s"] is not None else "-",
                     f"{s['kill_to_all_ended_s']:.1f}"])
    kills = result["sides"]["journal"]["kills"]
    lines = [f"resume: {result['jobs']} jobs of {result['turns']} turns, the RUN worker SIGKILLed halfway"
             f"{'' if kills == 1 else f' and {kills - 1} times more at random'} "
             f"({result['delay_s']} s per model turn)", "",
             *markdown_table(["side", "completed", "in flight at the kill", "resumed", "LLM requests", "model tokens",
                              "journaled tokens again",
                              "token-exact jobs", "kill -> next request p50 s", "kill -> all ended s"], rows), "",
             f"model tokens with the journal / restarting from zero: {result['tokens_ratio']:.2f}x "
             f"({result['tokens_saved']} tokens saved); time from the kill until every job ended: "
             f"{result['end_ratio']:.2f}x; jobs asked a turn again more than once per kill (journal side): "
             f"{result['sides']['journal']['jobs_asked_again_more_than_once_per_kill']}; attempts (jobs by the "
             f"attempt they ended on): journal {result['sides']['journal']['attempts']}, restart "
             f"{result['sides']['restart']['attempts']}"]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
