"""Forks at turn k of a 12-turn job against as many fresh jobs, in one run.

    python -m bench.fork                    # 8 forks at turn 6 of a 12-turn code job, and 8 fresh
    python -m bench.fork --forks 4 --turn 9

One real service (``LocalCluster``, bubblewrap sandboxes, a scripted LLM server answering each turn
after ``--delay`` s) and the shipped code problem ``code-001``: a scripted agent writes its solution
with the editor, runs it on an input with bash ten times, then calls ``finish`` (12 turns). A source
job runs first; then ``POST /jobs/<id>/fork`` starts ``--forks`` jobs at ``--turn``, and after them
the same number of fresh jobs of the same instance. From the LLM server's own log: requests and
prompt tokens sent to the backend, and tokens generated, per side; from the results: sandbox
set-up (the INIT stage), RUN (a fork's includes replaying the shared turns' tool calls) and the
wall time from the first submit until every job of the side ended.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._cli import markdown_table, run_benchmark
from handlers.tool_calls import tool_call

RESULTS = Path(__file__).parent / "results" / "fork.json"
TURNS = 12
SOLUTION = ("import sys\ndata = sys.stdin.read().split()\nt = int(data[0])\n"
            "print('\\n'.join(str(int(data[1 + 2 * i]) + int(data[2 + 2 * i])) for i in range(t)))\n")



REPLIES = [tool_call("editor", command="create", path="solution.py", file_text=SOLUTION)] + \
    [tool_call("bash", command=f"printf '1\\n{i} {i * i}\\n' | python3 solution.py") for i in range(1, TURNS - 1)] + \
    [tool_call("finish", answer="solution.py is written")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fork", description=__doc__.split("\n\n")[0])
    parser.add_argument("--forks", type=int, default=8, help="forks, and fresh jobs beside them")
    parser.add_argument("--turn", type=int, default=6, help="the turn the forks share up to")
    parser.add_argument("--delay", type=float, default=0.5, help="seconds the LLM server takes per turn")
    args = parser.parse_args(argv)
    if shutil.which("bwrap") is None:
        print("bubblewrap (bwrap) is needed: apt-get install bubblewrap", file=sys.stderr)
        return 1
    return run_benchmark(lambda: run(args), report, RESULTS,
                         lambda r: r["sides"]["fork"]["completed"] == r["forks"] and r["prompt_tokens_ratio"] < 1.0)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import httpx
    from transformers import AutoTokenizer

    from prorl_celery.core.status import Stage
    from prorl_celery.dev.devmodels import ensure_tokenizer
    from prorl_celery.dev.local import LocalCluster

    tokenizer = str(ensure_tokenizer("qwen3"))
    decoder = AutoTokenizer.from_pretrained(tokenizer)
    root = Path(tempfile.mkdtemp(prefix="prorl-bench-fork-"))
    rules = root / "rules.json"
    rules.write_text(json.dumps([{"match": "BENCH-FORK", "scope": "prompt", "replies": REPLIES,
                                  "delay_s": args.delay}]))
    problems = Path(__file__).resolve().parents[1] / "handlers" / "code" / "data" / "problems.jsonl"
    row = next(json.loads(line) for line in problems.read_text().splitlines() if '"code-001"' in line)
    row.pop("id")

    def instance(marker: str) -> dict[str, Any]:
        return {**row, "data_source": "codeforces", "problem": f"[BENCH-FORK {marker}] {row['problem']}",
                "max_iterations": TURNS}

    env = {"PRORL_RUNTIME": "bubblewrap", "PRORL_NODE": f"bench-fork-{os.getpid()}",
           "PRORL_SANDBOX_DIR": str(root / "sbx")}
    command = [sys.executable, "-m", "prorl_celery.dev.llm_server", "--scripted", str(rules), "--tokenizer",
               tokenizer, "--port", "{port}"]
    slots = max(8, args.forks)
    with LocalCluster(tokenizer=tokenizer, llm_command=command, env=env, gateway_workers=1, log_dir=root,
                      concurrency={Stage.INIT: 4, Stage.RUN: slots, Stage.EVAL: 2}) as cluster, \
            httpx.Client(base_url=cluster.gateway_url, timeout=600) as gateway:
        assert cluster.llm_url is not None
        llm = cluster.llm_url.removesuffix("/v1")
        assert gateway.post("/add_llm_server", json={"address": cluster.llm_url}).status_code == 200
        source = _wait(gateway, [gateway.post("/jobs", json={"instance": instance("source")}).json()["job_id"]])[0]
        assert source["status"] == "completed" and source["trajectory"]["num_turns"] == TURNS, source["error"]
        served_source = len(httpx.get(llm + "/_log", timeout=60).json())
        sides: dict[str, Any] = {}
        started = time.monotonic()
        forked = gateway.post(f"/jobs/{source['job_id']}/fork", json={"turn": args.turn, "count": args.forks})
        fork_results = _wait(gateway, [job["job_id"] for job in forked.json()["jobs"]])
        sides["fork"] = {"wall_s": time.monotonic() - started, "results": fork_results}
        started = time.monotonic()
        fresh_ids = [gateway.post("/jobs", json={"instance": {**instance("fresh"), "trajectory_id": i}})
                     .json()["job_id"] for i in range(args.forks)]
        sides["fresh"] = {"wall_s": time.monotonic() - started, "results": _wait(gateway, fresh_ids)}
        sides["fresh"]["wall_s"] = time.monotonic() - started
        log = httpx.get(llm + "/_log", timeout=60).json()
    marked: dict[str, list[dict]] = {"fork": [], "fresh": []}
    for request in log[served_source:]:
        text = decoder.decode(request["prompt_ids"])
        marked["fresh" if "[BENCH-FORK fresh]" in text else "fork"].append(request)
    out: dict[str, Any] = {}
    for side, data in sides.items():
        results = data["results"]
        requests = marked[side]
        timing = [r["timing"] for r in results]
        out[side] = {"completed": sum(r["status"] == "completed" for r in results), "requests": len(requests),
                     "prompt_tokens": sum(len(r["prompt_ids"]) for r in requests),
                     "generated_tokens": sum(len(r["output_ids"]) for r in requests),
                     "init_s_p50": statistics.median(t.get("init_s") or 0.0 for t in timing),
                     "run_s_p50": statistics.median(t.get("run_s") or 0.0 for t in timing),
                     "wall_s": data["wall_s"],
                     "shared_turns": [((r.get("fork") or {}).get("shared_turns")) for r in results][:1]}
    return {"forks": args.forks, "turn": args.turn, "turns": TURNS, "delay_s": args.delay, "sides": out,
            "prompt_tokens_ratio": out["fork"]["prompt_tokens"] / max(1, out["fresh"]["prompt_tokens"]),
            "wall_ratio": out["fork"]["wall_s"] / max(1e-9, out["fresh"]["wall_s"]), "log_dir": str(root)}


def _wait(gateway: Any, job_ids: list[str]) -> list[dict[str, Any]]:
    results = []
    for job_id in job_ids:
        while True:
            answer = gateway.get(f"/jobs/{job_id}", params={"wait": 60})
            if answer.status_code == 200:
                results.append(answer.json())
                break
    return results


def report(result: dict[str, Any]) -> str:
    rows = [[side, f"{s['completed']}/{result['forks']}", str(s["requests"]), str(s["prompt_tokens"]),
             str(s["generated_tokens"]), f"{s['init_s_p50']:.2f}", f"{s['run_s_p50']:.2f}", f"{s['wall_s']:.1f}"]
            for side, s in result["sides"].items()]
    return "\n".join([
        f"fork: {result['forks']} forks at turn {result['turn']} of a {result['turns']}-turn code job, against "
        f"{result['forks']} fresh jobs ({result['delay_s']} s per model turn)", "",
        *markdown_table(["side", "completed", "LLM requests", "prompt tokens sent", "tokens generated",
                         "INIT (sandbox set-up) p50 s", "RUN p50 s", "wall s"], rows), "",
        f"forks / fresh: prompt tokens {result['prompt_tokens_ratio']:.2f}x, wall time {result['wall_ratio']:.2f}x"])


if __name__ == "__main__":
    raise SystemExit(main())
