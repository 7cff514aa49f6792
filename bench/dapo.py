"""DAPO collection: the batch-synchronous baseline against the collector, in one run.

Both sides drive the same real service (a :class:`~prorl_celery.dev.local.LocalCluster`: gunicorn
gateway, Celery INIT/RUN/EVAL pools, Redis, the ``math`` handler) on the same simulated
backends, with the same prompt stream and the same rollout concurrency N = G * n:

* **baseline** (batch-synchronous dynamic sampling, as verl's DAPO recipe): submit G prompts x n
  rollouts, wait for all of them, drop the groups whose rewards are all equal, repeat until B
  informative groups are in hand (extras are discarded);
* **collector** (:class:`prorl_celery.trainer.dapo.AsyncDAPOCollector`): N rollouts always in flight,
  replenished one by one, the step cut the moment B informative groups are complete, the
  useful unfinished groups carried over and the rest cancelled.

**Simulated backends** (``python -m bench.dapo serve``, one process each) speak vLLM's
``/v1/completions`` token-id protocol with ``--slots`` concurrent sequences; a request waits for a
slot, then holds it for (output tokens x ``--token-latency``); a client that disconnects (a
cancelled rollout) frees its slot at once. ``GET /busy`` reports slot-seconds busy (and how much
of it went to requests later aborted). The reply depends on the prompt: ``[EASY i]`` always
right, ``[HARD i]`` always wrong, ``[MEDIUM i]`` right with probability ``--p-medium`` per sample;
the output length is log-normal (``--median-tokens``, ``--sigma``), seeded by prompt and sample,
so both sides see exactly the same work.

**Figures**: backend busy fraction (slot-seconds busy / (slots x wall time)) and informative
groups per minute, per side, and their ratios. Target: busy-fraction ratio >= 1.8.

    python -m bench.dapo [--steps 3] [--quick]

Prints a table and writes ``bench/results/dapo.json``.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response

from bench._cli import run_benchmark
from prorl_celery.core.status import Stage
from prorl_celery.dev.local import LocalCluster, ManagedProcess, free_port, wait_until
from prorl_celery.trainer.client import AsyncRolloutClient, JobRequest, new_job_id
from prorl_celery.trainer.dapo import AsyncDAPOCollector, not_all_equal

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "dapo.json"
TARGET_BUSY_RATIO = 1.8
RATIOS = ("busy_fraction", "useful_busy_fraction", "groups_per_min")
KINDS = ("EASY", "HARD", "MEDIUM")
PROMPT = re.compile(r"\[(EASY|HARD|MEDIUM) (\d+)\].*?\(sample (\d+)\)", re.S)


# -- the simulated backend ----------------------------------------------------------------------

@dataclass(frozen=True)
class SimPolicy:
    median_tokens: int = 120
    sigma: float = 0.7
    max_factor: float = 6.0
    p_medium: float = 0.5

    def decide(self, text: str) -> tuple[bool, int]:
        """(right?, output length) for a prompt; the same prompt and sample always get the same."""
        match = PROMPT.search(text)
        if match is None:
            return False, self.median_tokens
        kind, prompt_no, sample = match.groups()
        rng = random.Random(f"{prompt_no}/{sample}")
        length = self.median_tokens * math.exp(rng.gauss(0.0, self.sigma))
        length = int(min(max(length, 8), self.median_tokens * self.max_factor))
        return kind == "EASY" or (kind == "MEDIUM" and rng.random() < self.p_medium), length


class Slots:
    """``slots`` concurrent sequences and the integral of how many were busy."""

    def __init__(self, slots: int) -> None:
        self.slots, self.active = slots, 0
        self.semaphore = asyncio.Semaphore(slots)
        self.busy_s = self.aborted_s = 0.0
        self.served = self.aborted = 0
        self.started = self._last = time.monotonic()

    def _advance(self) -> None:
        now = time.monotonic()
        self.busy_s += self.active * (now - self._last)
        self._last = now

    async def hold(self, seconds: float) -> None:
        async with self.semaphore:
            self._advance()
            self.active += 1
            began = time.monotonic()
            try:
                await asyncio.sleep(seconds)
                self.served += 1
            except asyncio.CancelledError:
                self.aborted += 1
                self.aborted_s += time.monotonic() - began
                raise
            finally:
                self._advance()
                self.active -= 1

    def report(self) -> dict[str, Any]:
        self._advance()
        return {"slots": self.slots, "busy_slot_s": self.busy_s, "aborted_slot_s": self.aborted_s,
                "active": self.active, "served": self.served, "aborted": self.aborted,
                "uptime_s": time.monotonic() - self.started}


def create_sim_app(tokenizer: Any, slots: int, token_latency_s: float, policy: SimPolicy) -> FastAPI:
    app = FastAPI(docs_url=None, redoc_url=None)
    state = Slots(slots)
    filler = tokenizer.encode(" ok", add_special_tokens=False)[0]
    answers = {ok: tokenizer.encode(f" So \\boxed{{{1 if ok else 2}}}.", add_special_tokens=False)
               for ok in (True, False)}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await request.json()
        right, length = policy.decide(tokenizer.decode(body["prompt"]))
        answer = answers[right]
        ids = [filler] * max(0, length - len(answer) - 1) + answer + [tokenizer.eos_token_id]
        max_tokens = int(body.get("max_tokens") or 16)
        finish = "length" if len(ids) > max_tokens else "stop"
        ids = ids[:max_tokens]
        work = asyncio.ensure_future(state.hold(len(ids) * token_latency_s))
        gone = asyncio.ensure_future(_disconnected(request))
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if not work.done():  # the rollout was cancelled: free the slot now
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
            return Response(status_code=499)
        choice = {"index": 0, "text": "", "token_ids": ids, "finish_reason": finish,
                  "logprobs": {"token_logprobs": [-0.1] * len(ids)}}
        return {"id": new_job_id("cmpl-"), "object": "text_completion", "model": "sim", "choices": [choice]}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "sim", "object": "model"}]}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/busy")
    async def busy() -> dict[str, Any]:
        return state.report()

    return app


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def serve(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dapo serve")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--token-latency", type=float, default=0.02)
    parser.add_argument("--policy", default="{}", help="SimPolicy fields as JSON")
    args = parser.parse_args(argv)
    import uvicorn
    from transformers import AutoTokenizer

    app = create_sim_app(AutoTokenizer.from_pretrained(args.tokenizer), args.slots, args.token_latency,
                         SimPolicy(**json.loads(args.policy)))
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
    return 0


# -- the workload ----------------------------------------------------------------------------------

def prompts(seed: int, mix: tuple[float, float, float], start: int = 0) -> Iterator[dict[str, Any]]:
    """An endless stream of math prompts of the three kinds (the same for the same seed)."""
    rng = random.Random(seed)
    for number in itertools.count(start):
        kind = rng.choices(KINDS, weights=mix)[0]
        yield {"data_source": "math", "instance_id": f"{kind.lower()}-{number}",
               "problem": f"[{kind} {number}] What is 3 - 2?", "answer": "1"}


def rollout_body(instance: dict[str, Any], index: int) -> dict[str, Any]:
    """The sample index enters the prompt: the simulated backend answers per prompt and sample."""
    marked = {**instance, "problem": f"{instance['problem']} (sample {index})",
              "trajectory_id": f"{instance['instance_id']}-{index}"}
    return {"instance": marked, "sampling_params": {"max_tokens": 4096, "temperature": 1.0}}


# -- the two sides ----------------------------------------------------------------------------------

@dataclass
class Plan:
    steps: int = 3
    groups: int = 8  # B, informative groups per step; also G, prompts per baseline round
    n: int = 4
    backends: int = 2
    slots: int = 16
    token_latency_s: float = 0.02
    policy: SimPolicy = field(default_factory=SimPolicy)
    mix: tuple[float, float, float] = (0.25, 0.25, 0.5)
    seed: int = 7

    @property
    def in_flight(self) -> int:
        return self.groups * self.n


class Backends:
    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.http = httpx.AsyncClient(timeout=10)

    async def snapshot(self) -> dict[str, float]:
        reports = [(await self.http.get(url + "/busy")).json() for url in self.urls]
        return {key: sum(r[key] for r in reports) for key in ("slots", "busy_slot_s", "aborted_slot_s")}

    async def busy_per_slot(self) -> float:
        """The collector's busy probe: cumulative busy seconds per slot."""
        snap = await self.snapshot()
        return snap["busy_slot_s"] / snap["slots"]


async def measure(backends: Backends, name: str, side) -> dict[str, Any]:
    before, started = await backends.snapshot(), time.monotonic()
    details = await side()
    wall, after = time.monotonic() - started, await backends.snapshot()
    capacity = after["slots"] * wall
    busy = (after["busy_slot_s"] - before["busy_slot_s"]) / capacity
    aborted = (after["aborted_slot_s"] - before["aborted_slot_s"]) / capacity
    groups = sum(step["informative"] for step in details)
    return {"side": name, "wall_s": wall, "busy_fraction": busy, "aborted_fraction": aborted,
            "useful_busy_fraction": busy - aborted, "informative_groups": groups,
            "groups_per_min": 60 * groups / wall, "rollouts": sum(step["submitted"] for step in details),
            "cancelled": sum(step.get("cancelled", 0) for step in details),
            "carried_over": sum(step.get("carried_over", 0) for step in details), "steps": details}


async def baseline(client: AsyncRolloutClient, plan: Plan) -> list[dict[str, Any]]:
    stream, steps = prompts(plan.seed, plan.mix), []
    for step in range(1, plan.steps + 1):
        started, informative, submitted, rounds, filtered = time.monotonic(), 0, 0, 0, 0
        while informative < plan.groups:
            batch = [next(stream) for _ in range(plan.groups)]
            requests = [JobRequest(**rollout_body(p, i)) for p in batch for i in range(plan.n)]
            results = await client.wait_all(await client.submit_many(requests))
            if not any(r["status"] == "completed" for r in results):
                raise RuntimeError(f"every rollout of a round failed, e.g. {results[0].get('error')}")
            rounds, submitted = rounds + 1, submitted + len(requests)
            for k in range(len(batch)):
                rewards = [float(r["reward"]) for r in results[k * plan.n:(k + 1) * plan.n]]
                good = not_all_equal(rewards)
                informative, filtered = informative + good, filtered + (not good)
        steps.append({"step": step, "wall_s": time.monotonic() - started, "rounds": rounds,
                      "submitted": submitted, "filtered": filtered, "informative": plan.groups,
                      "surplus": informative - plan.groups})
    return steps


async def collector(client: AsyncRolloutClient, plan: Plan, backends: Backends) -> list[dict[str, Any]]:
    dapo = AsyncDAPOCollector(client, prompts(plan.seed, plan.mix), group_size=plan.n, batch_groups=plan.groups,
                              max_in_flight=plan.in_flight, make_request=lambda g, i: rollout_body(g.instance, i),
                              busy_probe=backends.busy_per_slot)
    try:
        return [(await dapo.next_batch()).stats.as_dict() for _ in range(plan.steps)]
    finally:
        await dapo.aclose(cancel=True)


async def measure_both(plan: Plan, gateway: str, backend_urls: list[str]) -> list[dict[str, Any]]:
    backends = Backends(backend_urls)
    async with AsyncRolloutClient(gateway, poll_s=10) as client:
        for url in backend_urls:
            await client.add_llm_server(url + "/v1")
        warm = Plan(**{**asdict(plan), "policy": plan.policy, "steps": 1, "groups": 2, "seed": plan.seed + 1})
        await collector(client, warm, backends)  # imports, pools and connections on every side
        await asyncio.sleep(1.0)
        phases = [await measure(backends, "baseline", lambda: baseline(client, plan)),
                  await measure(backends, "collector", lambda: collector(client, plan, backends))]
    await backends.http.aclose()
    return phases


# -- running and reporting ---------------------------------------------------------------------------

def start_backends(plan: Plan, tokenizer: str, log_dir: Path) -> tuple[list[ManagedProcess], list[str]]:
    processes, urls = [], []
    for k in range(plan.backends):
        port = free_port()
        command = [sys.executable, "-m", "bench.dapo", "serve", "--port", str(port), "--tokenizer", tokenizer,
                   "--slots", str(plan.slots), "--token-latency", str(plan.token_latency_s),
                   "--policy", json.dumps(asdict(plan.policy))]
        log = log_dir / f"sim{k}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                     start_new_session=True)
        processes.append(ManagedProcess(f"sim{k}", popen, log))
        urls.append(f"http://127.0.0.1:{port}")
    for process, url in zip(processes, urls, strict=True):
        wait_until(lambda url=url: httpx.get(url + "/health").status_code == 200, 120, process.name, process)
    return processes, urls


def run(plan: Plan) -> dict[str, Any]:
    from prorl_celery.dev.devmodels import ensure_tokenizer

    tokenizer = str(ensure_tokenizer("qwen3"))
    log_dir = Path(tempfile.mkdtemp(prefix="bench-dapo-"))
    concurrency = {Stage.INIT: 8, Stage.RUN: plan.in_flight + 8, Stage.EVAL: 8}
    sims: list[ManagedProcess] = []
    load_before = os.getloadavg()
    try:
        sims, urls = start_backends(plan, tokenizer, log_dir)
        with LocalCluster(tokenizer=tokenizer, concurrency=concurrency, log_dir=log_dir) as cluster:
            phases = asyncio.run(measure_both(plan, cluster.gateway_url, urls))
    finally:
        for process in sims:
            process.stop(grace_s=5)
    base, coll = phases
    ratios = {key: coll[key] / max(base[key], 1e-9) for key in RATIOS}
    return {"plan": {**asdict(plan), "in_flight": plan.in_flight}, "phases": phases, "ratios": ratios,
            "targets": {"busy_fraction_ratio": {"target": TARGET_BUSY_RATIO, "value": ratios["busy_fraction"],
                                                "ok": ratios["busy_fraction"] >= TARGET_BUSY_RATIO}},
            "load_average": {"before": load_before, "after": os.getloadavg()}, "log_dir": str(log_dir)}


def report(result: dict[str, Any]) -> str:
    base, coll = result["phases"]
    rows = [("backend busy fraction", "busy_fraction", "{:.1%}"),
            ("  on rollouts later cancelled", "aborted_fraction", "{:.1%}"),
            ("  on rollouts kept (useful)", "useful_busy_fraction", "{:.1%}"),
            ("informative groups / min", "groups_per_min", "{:.1f}"),
            ("wall time (s)", "wall_s", "{:.1f}"),
            ("rollouts submitted", "rollouts", "{:d}"),
            ("rollouts cancelled", "cancelled", "{:d}"),
            ("rollouts carried over", "carried_over", "{:d}")]
    plan = result["plan"]
    lines = [f"DAPO collection: B={plan['groups']} groups x n={plan['n']}, N={plan['in_flight']} in flight, "
             f"{plan['backends']} backends x {plan['slots']} slots, {plan['steps']} steps per side",
             f"{'':30}{'baseline':>12}{'collector':>12}{'ratio':>9}"]
    for label, key, fmt in rows:
        ratio = result["ratios"].get(key)
        lines.append(f"{label:30}{fmt.format(base[key]):>12}{fmt.format(coll[key]):>12}"
                     + (f"{ratio:>9.2f}" if ratio is not None else ""))
    target = result["targets"]["busy_fraction_ratio"]
    lines.append(f"target: busy-fraction ratio >= {target['target']}: {target['value']:.2f} "
                 f"{'ok' if target['ok'] else 'MISSED'}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> Plan:
    parser = argparse.ArgumentParser(prog="python -m bench.dapo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, help="training steps per side (default 3; --quick 1)")
    parser.add_argument("--groups", type=int, default=8, help="B informative groups per step (and G)")
    parser.add_argument("--n", type=int, default=4, help="rollouts per prompt")
    parser.add_argument("--backends", type=int, default=2)
    parser.add_argument("--slots", type=int, default=16, help="concurrent sequences per backend")
    parser.add_argument("--token-latency", type=float, help="seconds per output token (default 0.02)")
    parser.add_argument("--median-tokens", type=int, help="median output length (default 120; --quick 60)")
    parser.add_argument("--sigma", type=float, default=0.7, help="log-normal spread of output lengths")
    parser.add_argument("--p-medium", type=float, default=0.5, help="chance a MEDIUM sample is right")
    parser.add_argument("--mix", default="0.25,0.25,0.5", help="shares of EASY,HARD,MEDIUM prompts")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="a ~1 minute smoke run")
    args = parser.parse_args(argv)
    mix = tuple(float(x) for x in args.mix.split(","))
    if len(mix) != 3 or min(mix) < 0 or sum(mix) <= 0:
        parser.error("--mix: three non-negative shares")
    policy = SimPolicy(median_tokens=args.median_tokens or (60 if args.quick else 120), sigma=args.sigma,
                       p_medium=args.p_medium)
    return Plan(steps=args.steps or (1 if args.quick else 3), groups=args.groups, n=args.n,
                backends=args.backends, slots=args.slots, token_latency_s=args.token_latency or 0.02,
                policy=policy, mix=mix, seed=args.seed)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        return serve(argv[1:])
    plan = parse_args(argv)

    return run_benchmark(lambda: run(plan), report, RESULTS, lambda r: r["targets"]["busy_fraction_ratio"]["ok"])


if __name__ == "__main__":
    sys.exit(main())
