"""The RUN worker's CPU per turn, part by part, each beside what it replaced, in one run.

    python -m bench.run_turn                    # 1,000 requests in flight, 4 interleaved rounds
    python -m bench.run_turn --requests 500 --rounds 6

- **request**: a scripted LLM server (its own process, replies after ``--delay`` s) gets
  ``--requests`` concurrent one-turn ``VLLMBackend.complete`` calls from this process's uvloop
  loop, a fresh connection per request as the RUN worker makes them; process CPU per request
  with ``aiohttp.TCPConnector`` (connects through aiohappyeyeballs) and with
  ``backends.DirectConnector`` (the loop's own ``create_connection``). The server's CPU is not
  counted.
- **start**: ``StageLoop.admit_many`` of ``--requests`` stages in chunks of 32, started in one
  loop wake-up per chunk (``_spawn``) and, as before, by a ``run_coroutine_threadsafe`` each.
- **encode**: a one-turn math job's prompt (``ChatTokenizer.encode`` of its rendering), by
  piece with the piece cache (``PieceEncoder``) and as one text.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench._cli import markdown_table, run_benchmark

RESULTS = Path(__file__).parent / "results" / "run_turn.json"
CONNECTORS = {"aiohttp": aiohttp.TCPConnector, "direct": None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run_turn", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="requests in flight at once")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds per connector")
    parser.add_argument("--delay", type=float, default=1.0, help="seconds the server takes per reply")
    args = parser.parse_args(argv)
    return run_benchmark(lambda: run(args), report, RESULTS,
                         lambda result: all(part["ratio"] < 1.0 for part in result["parts"].values()))


def run(args: argparse.Namespace) -> dict[str, Any]:
    import httpx
    import uvloop

    from prorl_celery.dev.devmodels import ensure_tokenizer
    from prorl_celery.dev.local import free_port
    from prorl_celery.llm.tokenizer import load_tokenizer

    tokenizer = str(ensure_tokenizer("qwen3"))
    directory = Path(tempfile.mkdtemp(prefix="prorl-run-turn-"))
    rules = directory / "rules.json"
    rules.write_text(json.dumps([{"match": "CLIENT", "replies": ["The answer is \\boxed{2}."],
                                  "delay_s": args.delay, "scope": "prompt"}]))
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "prorl_celery.dev.llm_server", "--scripted", str(rules),
                               "--tokenizer", tokenizer, "--port", str(port), "--log-level", "warning"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("the scripted LLM server did not start")
            time.sleep(0.5)
        prompt = load_tokenizer(tokenizer).prompt_ids([{"role": "user", "content": "CLIENT: what is 1 + 1?"}])
        address = f"http://127.0.0.1:{port}/v1"
        per_request: dict[str, list[float]] = {name: [] for name in CONNECTORS}
        for _ in range(args.rounds):
            for name in CONNECTORS:
                per_request[name].append(uvloop.run(_round(name, address, prompt, args.requests)))
    finally:
        server.terminate()
        server.wait(10)
    parts = {"request": _part(per_request, "direct", "aiohttp"),
             "start": _part(_starts(args.requests, args.rounds), "one wake-up a chunk", "a future a stage"),
             "encode": _part(_encodes(tokenizer, args.rounds), "by piece", "whole")}
    return {"requests": args.requests, "rounds": args.rounds, "delay_s": args.delay, "parts": parts}


def _part(values: dict[str, list[float]], this: str, before: str) -> dict[str, Any]:
    """CPU ms per item by round of each way, and this way's median over the one it replaced."""
    medians = {name: statistics.median(rounds) for name, rounds in values.items()}
    return {"ms": values, "median_ms": medians, "this": this, "before": before,
            "ratio": medians[this] / medians[before]}


def _starts(stages: int, rounds: int) -> dict[str, list[float]]:
    from prorl_celery.core.event_loops import StageLoop

    class PerStage(StageLoop):
        def _spawn(self, coros: list[Any]) -> None:  # what admit_many did before
            for coro in coros:
                asyncio.run_coroutine_threadsafe(self._holding_slot(coro), self.loop)

    async def stage() -> None:
        await asyncio.sleep(0.2)

    values: dict[str, list[float]] = {"one wake-up a chunk": [], "a future a stage": []}
    ways: list[tuple[str, type[StageLoop]]] = [("one wake-up a chunk", StageLoop), ("a future a stage", PerStage)]
    for round_ in range(rounds):
        for name, kind in ways[::-1] if round_ % 2 else ways:  # each goes first in half the rounds
            loop = kind(stages, name="bench-stages")
            loop.call(asyncio.sleep(0), 10)  # its thread started before the clock
            gc.collect()  # the last round's garbage is not this one's
            started = time.process_time()
            admitted = 0
            while admitted < stages:
                admitted += loop.admit_many(min(32, stages - admitted),
                                            lambda _loop, n: [stage() for _ in range(n)])
            loop.wait_idle(30)
            values[name].append((time.process_time() - started) / stages * 1000)
            loop.close()
    return values


def _encodes(tokenizer: str, rounds: int, prompts: int = 2000) -> dict[str, list[float]]:
    from handlers.math.instances import normalize_instance
    from prorl_celery.llm.tokenizer import ChatTokenizer, HFTokenizer

    by_piece = ChatTokenizer(HFTokenizer(tokenizer))
    whole = ChatTokenizer(HFTokenizer(tokenizer))
    whole._pieces = None

    def texts(round_: int) -> list[str]:  # every round's problems are new, as a burst's are
        return [by_piece.render(normalize_instance({"data_source": "math", "problem": f"BURST {round_}-{i}: 1 + 1?",
                                                    "answer": "2"}).messages, None, add_generation_prompt=True)
                for i in range(prompts)]

    values: dict[str, list[float]] = {"by piece": [], "whole": []}
    for round_ in range(rounds):
        for name, chat in (("by piece", by_piece), ("whole", whole)):
            prompts_of_round = texts(round_)
            started = time.process_time()
            for text in prompts_of_round:
                chat.encode(text)
            values[name].append((time.process_time() - started) / prompts * 1000)
    return values


async def _round(name: str, address: str, prompt: list[int], requests: int) -> float:
    from prorl_celery.llm.backends import DirectConnector, VLLMBackend

    factory = CONNECTORS[name] or DirectConnector
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=30)
    async with aiohttp.ClientSession(connector=factory(limit=0, force_close=True), timeout=timeout) as client:
        backend = VLLMBackend(address, client)
        await backend.complete(prompt, {"max_tokens": 16})  # the model card, read once
        started = time.process_time()
        await asyncio.gather(*(backend.complete(prompt, {"max_tokens": 16}) for _ in range(requests)))
        return (time.process_time() - started) / requests * 1000


def report(result: dict[str, Any]) -> str:
    lines = [f"{result['requests']} requests (stages) at once, LLM delay {result['delay_s']} s; CPU ms per item, "
             f"{result['rounds']} interleaved rounds"]
    rows = []
    for part, values in result["parts"].items():
        for name in (values["before"], values["this"]):
            rounds = " ".join(f"{v:.3f}" for v in values["ms"][name])
            rows.append([part, name, rounds, f"{values['median_ms'][name]:.3f}",
                         f"{values['ratio']:.2f}x" if name == values["this"] else ""])
    lines += markdown_table(["part", "way", "per round", "median", "this / before"], rows)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
