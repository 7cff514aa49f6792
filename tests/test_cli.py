"""The ``prorl`` command: local mode leaves nothing behind; the token fidelity check."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from prorl_celery.local import wait_until

#: the command under test, from this checkout (the installed `prorl` script may point elsewhere)
PRORL = [sys.executable, "-m", "prorl_celery.cli"]


def descendants(pid: int) -> set[int]:
    """Every process below ``pid``, read from /proc (never by name)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, stack = set(), [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.add(child)
            stack.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_up_stops_every_child_on_sigterm(tmp_path, redis_url):
    up = subprocess.Popen([*PRORL, "up", "--llm", "none",
                           "--init-workers", "1", "--run-workers", "1", "--eval-workers", "1"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "PRORL_HANDLERS": ""}, start_new_session=True)
    lines = []
    try:
        for line in up.stdout:
            lines.append(line)
            if line.startswith("gateway"):
                break
        gateway = lines[-1].split()[-1]
        assert httpx.get(gateway + "/healthz").json() == {"ok": True}, "".join(lines)
        children = descendants(up.pid)
        assert len(children) >= 5  # redis, gunicorn (+ its workers), three celery workers
        up.send_signal(signal.SIGTERM)
        assert up.wait(60) == 0
        wait_until(lambda: not any(alive(pid) for pid in children), 30, "children to exit")
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)


def test_tokens_check_command(tmp_path, llama3_tokenizer):
    from prorl_celery.llm.tokenizer import load_tokenizer
    chat = load_tokenizer(llama3_tokenizer)
    messages = [{"role": "user", "content": "hi"}]
    prompt = chat.prompt_ids(messages)
    reply = chat.encode("hello") + [chat.eot_id]
    good = {"prompt_ids": prompt, "response_ids": reply,
            "messages": messages + [{"role": "assistant", "content": "hello"}]}
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"trajectory": good}))
    run = subprocess.run([*PRORL, "tokens", "check", str(path), "--tokenizer", llama3_tokenizer],
                         capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.startswith("match"), run.stdout + run.stderr
    bad = dict(good, response_ids=chat.encode("hel") + chat.encode("lo") + [chat.eot_id])
    path.write_text(json.dumps(bad))
    run = subprocess.run([*PRORL, "tokens", "check", str(path), "--tokenizer", llama3_tokenizer],
                         capture_output=True, text=True)
    assert run.returncode == 1 and "drift at id" in run.stdout


def test_submit_posts_a_data_set_and_summarises(tmp_path, gateway, llm_servers):
    server = llm_servers[0]
    server.reset()
    gateway.post("/add_llm_server", json={"address": server.address()}).raise_for_status()
    rows = [{"problem": "What is 2 + 3?", "answer": "5"}, {"problem": "What is 7 \\times 6?", "answer": "42"},
            {"prompt": [{"role": "user", "content": "MULTI: what is 10 - 4?"}],
             "reward_model": {"ground_truth": "6"}, "data_source": "deepscaler", "max_iterations": 3}]
    data = tmp_path / "set.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    run = subprocess.run([*PRORL, "submit", str(data), "--task", "math", "--gateway", gateway.cluster.gateway_url,
                          "--samples", "2", "--run-id", "r1"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    results = [json.loads(line) for line in (tmp_path / "set.results.jsonl").read_text().splitlines()]
    assert len(results) == 6 and all(r["status"] == "completed" for r in results)
    assert sorted(r["reward"] for r in results) == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    assert "jobs        6  (completed 6)" in run.stdout and "reward      mean 0.667" in run.stdout
    calls = len(server.log())
    assert calls == 2 * (1 + 1 + 3)  # two samples of two one-turn rows and one three-turn row
    again = subprocess.run([*PRORL, "submit", str(data), "--task", "math", "--gateway",
                            gateway.cluster.gateway_url, "--samples", "2", "--run-id", "r1"],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0
    assert len(server.log()) == calls  # the resumed run reused every job: no new backend call
