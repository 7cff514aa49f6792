"""The per-turn journal's cost: the same turns with the journal on and off, in one run.

    python -m bench.journal                 # 32 jobs at once x 8 turns, 6 interleaved rounds
    python -m bench.journal --jobs 128 --rounds 4

Each job is a ``TokenSession`` on one uvloop loop (as the RUN worker runs its stages) with the
qwen3 tokenizer and a real redis-server; a turn is ``generate`` (an in-process backend that
answers at once with 48 ids and their logprobs: the model's time is left out, so the journal's
share is that of the service's own work per turn, the worst case), a tool action noted and a
400-character observation added. With the journal on, each turn appends its model event and
then its action and observation (``TurnJournal`` through ``JournalStore.append_on_loop``, the
appends of the loop's jobs in one pipeline per loop iteration). Reported: the p50 and mean of a
turn's wall time with and without, their ratio, the loop's time per turn (a round's wall time
over its turns: one thread, so what a turn costs the RUN worker), and per turn the Redis commands
(server ``INFO commandstats``: the Lua scripts' own commands count) and journal bytes. Target: the
journal adds under 0.5 ms of loop time per turn (a model turn takes hundreds of ms or more).
"""
from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._cli import markdown_table, run_benchmark

RESULTS = Path(__file__).parent / "results" / "journal.json"
TURNS = 8
OBSERVATION = ("x = 2 * x + 1 -> " + "0123456789" * 38)[:400]


class InstantBackend:
    """Answers every prompt at once with the same 48 ids: no model time in the measure."""

    address = "in-process"
    protocol = "vllm"

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    async def complete(self, prompt_ids: list[int], params: dict[str, Any]) -> Any:
        from prorl_celery.llm.backends import Completion
        await asyncio.sleep(0)
        return Completion(list(self.ids), [-0.125 - i / 1000 for i in range(len(self.ids))], "stop")

    async def context_length(self) -> int | None:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.journal", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=32, help="jobs on the loop at once")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds per side")
    args = parser.parse_args(argv)
    return run_benchmark(lambda: run(args), report, RESULTS, _passed)


def _passed(result: dict[str, Any]) -> bool:
    return bool(result["loop_ms_per_turn"]["on"] - result["loop_ms_per_turn"]["off"] < 0.5)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import redis
    import uvloop

    from prorl_celery.dev.devmodels import ensure_tokenizer
    from prorl_celery.dev.local import free_port
    from prorl_celery.llm.tokenizer import load_tokenizer
    from prorl_celery.state.journal import JournalStore

    tokenizer = load_tokenizer(str(ensure_tokenizer("qwen3")))
    reply = tokenizer.encode('<tool_call>\n{"name": "python", "arguments": {"code": "x = 2 * x + 1\\nprint(x)"}}'
                             '\n</tool_call>')[:47] + [tokenizer.eot_id]
    port = free_port()
    directory = Path(tempfile.mkdtemp(prefix="prorl-bench-journal-"))
    binary = shutil.which("redis-server") or "redis-server"
    server = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                              stdout=open(directory / "redis.log", "wb"), stderr=subprocess.STDOUT)
    try:
        client = redis.Redis(port=port, decode_responses=True)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        store = JournalStore(client, max_events=20_000, max_bytes=64 * 2**20)
        sides: dict[str, dict[str, list[float]]] = {"off": {"turn": [], "round": []}, "on": {"turn": [], "round": []}}
        commands = {"off": 0, "on": 0}
        nbytes = 0
        for round_ in range(args.rounds):
            for side in ("off", "on") if round_ % 2 == 0 else ("on", "off"):
                client.config_resetstat()
                began = time.perf_counter()
                times, written = uvloop.run(_round(tokenizer, reply, store if side == "on" else None,
                                                   args.jobs, f"r{round_}"))
                sides[side]["round"].append(time.perf_counter() - began)
                sides[side]["turn"] += times
                commands[side] += sum(int(v["calls"]) for k, v in client.info("commandstats").items()
                                      if k not in {"cmdstat_config", "cmdstat_info"})
                nbytes += written
                client.flushdb()
        turns = args.rounds * args.jobs * TURNS
        off, on = sides["off"]["turn"], sides["on"]["turn"]
        return {"jobs": args.jobs, "rounds": args.rounds, "turns_per_side": turns,
                "p50_ms": {"off": statistics.median(off) * 1e3, "on": statistics.median(on) * 1e3},
                "mean_ms": {"off": statistics.fmean(off) * 1e3, "on": statistics.fmean(on) * 1e3},
                "ratio_p50": statistics.median(on) / statistics.median(off),
                "ratio_mean": statistics.fmean(on) / statistics.fmean(off),
                # the loop's time per turn: a round's wall time over its turns (one thread, so CPU)
                "loop_ms_per_turn": {side: sum(sides[side]["round"]) / turns * 1e3 for side in sides},
                "redis_commands_per_turn": {side: commands[side] / turns for side in commands},
                "journal_bytes_per_turn": nbytes / turns}
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(directory, ignore_errors=True)


async def _round(tokenizer: Any, reply: list[int], store: Any, jobs: int, tag: str) -> tuple[list[float], int]:
    from prorl_celery.llm.journal import TurnJournal
    from prorl_celery.llm.session import TokenSession

    times: list[float] = []
    journals: list[TurnJournal] = []

    async def one(n: int) -> None:
        journal = None
        if store is not None:
            job_id = f"{tag}-{n}"
            await asyncio.to_thread(store.begin, job_id, 1)
            journal = TurnJournal(job_id, 1, store.append_on_loop)
            journals.append(journal)
        session = TokenSession(tokenizer=tokenizer, backend=InstantBackend(reply), sampling_params={},
                               max_model_len=32768, default_max_tokens=256, journal=journal)
        session.start([{"role": "user", "content": f"job {n}: what is x after 7 steps?"}])
        for _ in range(TURNS):
            started = time.perf_counter()
            await session.generate()
            session.note_action("python", {"code": "x = 2 * x + 1\nprint(x)"})
            session.add_message("tool", OBSERVATION)
            times.append(time.perf_counter() - started)
        if journal is not None:
            await journal.flush()

    await asyncio.gather(*(one(n) for n in range(jobs)))
    written = 0
    if store is not None:
        written = sum(int(store.meta(j.job_id).get("bytes", 0)) for j in journals)
    return times, written


def report(result: dict[str, Any]) -> str:
    rows = [[side, f"{result['p50_ms'][side]:.3f}", f"{result['mean_ms'][side]:.3f}",
             f"{result['loop_ms_per_turn'][side]:.3f}",
             f"{result['redis_commands_per_turn'][side]:.2f}",
             f"{result['journal_bytes_per_turn']:.0f}" if side == "on" else "0"] for side in ("off", "on")]
    lines = [f"journal: {result['jobs']} jobs at once x {TURNS} turns, {result['rounds']} rounds per side "
             f"({result['turns_per_side']} turns each)", "",
             *markdown_table(["journal", "turn p50 ms", "turn mean ms", "loop ms / turn", "Redis commands / turn",
                              "bytes / turn"], rows),
             "", f"on / off: p50 {result['ratio_p50']:.2f}x, mean {result['ratio_mean']:.2f}x, loop time per turn "
             f"{result['loop_ms_per_turn']['on'] / result['loop_ms_per_turn']['off']:.2f}x, "
             f"+{result['loop_ms_per_turn']['on'] - result['loop_ms_per_turn']['off']:.3f} ms "
             f"(target: under 0.5 ms of loop time per turn)"]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
