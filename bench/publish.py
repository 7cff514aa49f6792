"""The CPU of publishing stage messages: ``celery_app.publish`` against Celery's ``send_task``.

Both publish the same stage messages (``prorl.run`` with a job id) to a real redis-server, in
alternating rounds, at the batch sizes the service uses: one message (the gateway's INIT of one
``POST /process``, a lone hand-over) and a batch of them in one pipeline (a stage loop's
hand-overs of one turn, a ``POST /jobs`` list). ``send_task`` is how ``publish`` sent them
before: one ``send_task`` per message, a batch over one producer inside ``Producer.batch``.
CPU is this process's (``time.process_time``) per message; only the ratios mean anything on a
shared machine. The headers of both sides' messages are compared as they were read back.

    python -m bench.publish [--messages N] [--rounds R] [--quick]

Prints a table and writes ``bench/results/publish.json``.
"""
from __future__ import annotations

import argparse
import base64
import json
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from bench._cli import run_benchmark
from prorl_celery.celery_app import Message, create_celery, publish
from prorl_celery.core.settings import Settings
from prorl_celery.core.status import Stage
from prorl_celery.dev.local import ManagedProcess, free_port, redis_server_binary, wait_until

RESULTS = Path(__file__).resolve().parent / "results" / "publish.json"
BATCHES = (1, 4, 32)
#: publish's CPU per message at most this share of send_task's, at every batch size
TARGET_RATIO = 0.8


def send_task_publish(app: Celery, messages: list[Message]) -> None:
    """The baseline: Celery's ``send_task`` per message (over one producer in one pipeline for a
    batch), as ``celery_app.publish`` did before."""
    if len(messages) == 1:
        stage, queue, payload = messages[0]
        app.send_task(f"prorl.{stage.value}", args=[payload], queue=queue or stage.value, retry=False, declare=[])
        return
    with app.producer_or_acquire() as producer, producer.batch():
        for stage, queue, payload in messages:
            app.send_task(f"prorl.{stage.value}", args=[payload], queue=queue or stage.value, producer=producer,
                          declare=[])


def cpu_per_message_us(send: Callable[[list[Message]], None], count: int, batch: int) -> float:
    started = time.process_time()
    for _ in range(max(1, count // batch)):
        send([(Stage.RUN, None, uuid.uuid4().hex) for _ in range(batch)])
    return (time.process_time() - started) * 1e6 / (max(1, count // batch) * batch)


def header_keys(client: redis.Redis) -> set[str]:
    raw = client.rpop(Stage.RUN.value)
    assert raw is not None, "no message was published"
    message = json.loads(raw)
    json.loads(base64.b64decode(message["body"]))  # the body decodes as the worker will
    return set(message["headers"])


def run(plan: argparse.Namespace) -> dict[str, Any]:
    binary = redis_server_binary()
    if binary is None:
        raise SystemExit("redis-server not found")
    port = free_port()
    log_dir = Path(tempfile.mkdtemp(prefix="prorl-bench-publish-"))
    log = (log_dir / "redis.log").open("w")
    server = ManagedProcess("redis", subprocess.Popen(
        [binary, "--port", str(port), "--save", "", "--appendonly", "no"], stdout=log, stderr=log,
        start_new_session=True), log_dir / "redis.log")
    try:
        url = f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url)
        wait_until(client.ping, 10, "redis-server", server)
        app = create_celery(Settings(redis_url=url, broker_url=url), set_as_current=False)
        sides: dict[str, Callable[[list[Message]], None]] = {
            "send_task": lambda messages: send_task_publish(app, messages),
            "publish": lambda messages: publish(messages, celery=app)}
        keys = {}
        for name, send in sides.items():  # warm-up, and the messages' headers side by side
            client.flushdb()
            send([(Stage.RUN, None, "warm-up")])
            keys[name] = sorted(header_keys(client))
            cpu_per_message_us(send, 200, 4)
        samples: dict[int, dict[str, list[float]]] = {batch: {name: [] for name in sides} for batch in BATCHES}
        for number in range(plan.rounds):
            for batch in BATCHES:
                for name in (list(sides) if number % 2 == 0 else list(sides)[::-1]):
                    client.flushdb()
                    samples[batch][name].append(cpu_per_message_us(sides[name], plan.messages, batch))
        app.close()
        rows = {}
        for batch, per_side in samples.items():
            medians = {name: statistics.median(values) for name, values in per_side.items()}
            rows[str(batch)] = {**{f"{name}_us": round(value, 1) for name, value in medians.items()},
                                "ratio": medians["publish"] / medians["send_task"]}
        return {"benchmark": "publish", "plan": vars(plan), "per_batch": rows, "headers": keys,
                "same_headers": keys["publish"] == keys["send_task"], "log_dir": str(log_dir)}
    finally:
        server.stop()
        log.close()


def report(result: dict[str, Any]) -> str:
    lines = ["stage message publish: CPU us per message, celery_app.publish vs send_task "
             f"(median of {result['plan']['rounds']} alternating rounds)",
             f"{'batch':>8} {'send_task':>10} {'publish':>10} {'ratio':>7}"]
    for batch, row in result["per_batch"].items():
        lines.append(f"{batch:>8} {row['send_task_us']:>10.1f} {row['publish_us']:>10.1f} {row['ratio']:>7.2f}")
    lines.append(f"same header names as send_task's: {result['same_headers']}")
    return "\n".join(lines)


def passed(result: dict[str, Any]) -> bool:
    return result["same_headers"] and all(row["ratio"] <= TARGET_RATIO for row in result["per_batch"].values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.publish", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=2000, help="messages per round and batch size")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per side, alternating")
    parser.add_argument("--quick", action="store_true", help="500 messages, 4 rounds")
    plan = parser.parse_args(argv)
    if plan.quick:
        plan.messages, plan.rounds = 500, 4
    return run_benchmark(lambda: run(plan), report, RESULTS, passed)


if __name__ == "__main__":
    raise SystemExit(main())
