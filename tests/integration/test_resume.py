"""Resume at the last journaled turn (issue 26, DESIGN decision 18) on a real service.

A real RUN worker is SIGKILLed while math jobs with the python tool are halfway through a
10-turn rollout (bubblewrap sandboxes, a persistent IPython whose state each turn builds on).
The lease reaper retries each job from INIT (a fresh sandbox); RUN finds the journal of the
first attempt, replays its tool actions (each observation checked: the IPython state is rebuilt)
and takes its model turns from the journal. Checked against the scripted LLM server's own log:
every model turn of the final trajectory is token-exact with what the server generated, and no
journaled turn was generated twice (only the turn in flight at the kill may be asked again).

A second test makes a tool answer differently on replay (the time): the resume meets the
difference, restarts from turn zero on a fresh sandbox, and the result says so and where.

Then jobs made from a finished job's journal: a replay (no model asked; every observation
checked, the reward then and now; ``prorl replay`` too) and forks at turn k (the shared turns
taken from the journal, never generated again, the sandbox state rebuilt by replay, routed to
the source's backend).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter

import pytest
import redis

from handlers.tool_calls import tool_call
from prorl_celery.core.status import Stage
from prorl_celery.dev.local import LocalCluster
from prorl_celery.state import keys
from prorl_celery.trainer import RolloutClient
from tests.support.services import (
    Gateway,
    LLMServer,
    eventually,
    kill_run_worker,
    killable_cluster,
    scripted_llm,
)

TURNS = 8  # the math family's cap on max_iterations
ANSWER = str(2 ** (TURNS - 1) - 1)  # x after TURNS - 2 steps of x = 2 * x + 1 from 1
# kept out of the default run's 10 minutes (CI's extended phase runs it every time)
pytestmark = [pytest.mark.extended,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")]


def python_call(code: str) -> str:
    return tool_call("python", code=code)


#: turn 1 sets x, each later turn doubles it: an observation is right only on a sandbox whose
#: IPython state the earlier turns built
STATEFUL = [python_call("x = 1\nprint(x)")] + [python_call("x = 2 * x + 1\nprint(x)")] * (TURNS - 2) + \
    [f"The answer is \\boxed{{{ANSWER}}}."]
#: turn 3's observation is the time in nanoseconds: never the same twice
CLOCK = [python_call("print(1)"), python_call("print(2)"), python_call("import time; print(time.time_ns())")] + \
    [python_call(f"print({i})") for i in range(4, TURNS)] + ["\\boxed{1}"]


@pytest.fixture(scope="module")
def llm(qwen3_tokenizer, tmp_path_factory) -> LLMServer:
    """A scripted server whose replies take 0.4 s each, so a kill lands mid-rollout."""
    rules = [{"match": "RESUME-STATEFUL", "scope": "prompt", "replies": STATEFUL, "delay_s": 0.4},
             {"match": "RESUME-CLOCK", "scope": "prompt", "replies": CLOCK, "delay_s": 0.4}]
    with scripted_llm(qwen3_tokenizer, tmp_path_factory, "resume-llm", rules) as server:
        yield server


@pytest.fixture(scope="module")
def second_llm(qwen3_tokenizer, tmp_path_factory) -> LLMServer:
    """Another backend with the same rules: forks must not be routed to it."""
    with scripted_llm(qwen3_tokenizer, tmp_path_factory, "resume-llm2",
                      [{"match": "RESUME", "scope": "prompt", "replies": STATEFUL}]) as server:
        yield server


@pytest.fixture(scope="module")
def cluster(qwen3_tokenizer, llm, tmp_path_factory) -> LocalCluster:
    with killable_cluster("resume", qwen3_tokenizer, llm, tmp_path_factory,
                          {Stage.INIT: 4, Stage.RUN: 8, Stage.EVAL: 2}) as local:
        yield local


def math_job(tag: str, n: int) -> dict:
    return {"data_source": "math", "problem": f"{tag} job {n}: what is x after {TURNS - 1} steps?",
            "answer": ANSWER, "tools": ["python"], "max_iterations": TURNS}


def requests_of(llm: LLMServer, tag: str, n: int, tokenizer) -> list[dict]:
    marker = f"{tag} job {n}:"
    return [r for r in llm.log() if marker in tokenizer.decode(r["prompt_ids"])]


def turns_served(llm: LLMServer, tag: str, n: int, tokenizer) -> int:
    return len([r for r in requests_of(llm, tag, n, tokenizer) if r["finished"]])


def test_a_killed_run_worker_resumes_each_rollout_at_its_last_journaled_turn(cluster, llm, qwen3_hf_tokenizer):
    llm.reset()
    state = redis.Redis.from_url(cluster.state_url, decode_responses=True)
    with Gateway(cluster) as gateway:
        jobs = [gateway.submit(math_job("RESUME-STATEFUL", n), max_attempts=2) for n in range(4)]
        eventually(lambda: all(turns_served(llm, "RESUME-STATEFUL", n, qwen3_hf_tokenizer) >= TURNS // 2 - 1
                               for n in range(4)), 120, "every job about halfway")
        kill_run_worker(cluster)
        results = [gateway.result(job_id, wait=120) for job_id in jobs]
    for n, result in enumerate(results):
        assert (result["status"], result["attempt"], result["reward"]) == ("completed", 2, 1.0), result["error"]
        resume = result["resume"]
        assert resume["resumed"] is True, resume
        assert resume["from_turn"] >= TURNS // 2 - 1 and resume["observations_checked"] >= resume["from_turn"] - 1
        trajectory = result["trajectory"]
        assert trajectory["num_turns"] == TURNS
        observations = [m["content"] for m in trajectory["messages"] if m["role"] == "tool"]
        assert observations[-1].strip().endswith(ANSWER), observations  # the state was rebuilt by replay

        served = requests_of(llm, "RESUME-STATEFUL", n, qwen3_hf_tokenizer)
        by_prompt = {tuple(r["prompt_ids"]): r for r in served if r["finished"] and not r["aborted"]}
        context = trajectory["prompt_ids"] + trajectory["response_ids"]
        for turn in trajectory["turns"]:  # each model turn is exactly what the server generated
            start = len(trajectory["prompt_ids"]) + turn["output_start"]
            generated = by_prompt[tuple(context[:turn["context_len"]])]
            assert context[start:start + turn["output_len"]] == generated["output_ids"]
        asked = Counter(tuple(r["prompt_ids"]) for r in served)
        twice = [len(prompt) for prompt, count in asked.items() if count > 1]
        # only the turn in flight at the kill (never journaled) may have been asked again
        assert len(twice) <= 1 and len(served) <= TURNS + 1, (twice, len(served))
        journaled = [t["context_len"] for t in trajectory["turns"][:resume["from_turn"]]]
        assert not set(twice) & set(journaled), "a journaled turn was generated again"
        assert 0 < state.ttl(keys.journal(jobs[n])) <= state.ttl(keys.job(jobs[n])) + 1  # expires with the job


@pytest.mark.extended  # ~25 s: a whole rollout twice over, after the kill
def test_an_observation_that_differs_on_replay_restarts_from_turn_zero(cluster, llm, qwen3_hf_tokenizer):
    llm.reset()
    with Gateway(cluster) as gateway:
        job_id = gateway.submit(math_job("RESUME-CLOCK", 0), max_attempts=2)
        eventually(lambda: turns_served(llm, "RESUME-CLOCK", 0, qwen3_hf_tokenizer) >= 5, 120, "the job past turn 4")
        kill_run_worker(cluster)
        result = gateway.result(job_id, wait=120)
    assert (result["status"], result["attempt"]) == ("completed", 2), result["error"]
    resume = result["resume"]
    assert resume["resumed"] is False and resume["restarted"] is True, resume
    assert resume["diverged_at_turn"] == 3 and resume["difference"]["kind"] == "observation", resume
    assert result["trajectory"]["num_turns"] == TURNS


# -- replay and fork: jobs made from a finished job's journal --------------------------------------

def finished_job(gateway: Gateway, tag: str, n: int) -> dict:
    result = gateway.result(gateway.submit(math_job(tag, n)), wait=120)
    assert result["status"] == "completed", result["error"]
    return result


def test_replay_reproduces_every_observation_and_the_reward_without_asking_the_model(cluster, llm, qwen3_hf_tokenizer):
    llm.reset()
    with Gateway(cluster) as gateway:
        source = finished_job(gateway, "RESUME-STATEFUL", 10)
        asked = len(llm.log())
        with RolloutClient(cluster.gateway_url) as client:  # the trainer SDK's way in
            (replay_id,) = client.replay(source["job_id"])
        result = gateway.result(replay_id, wait=120)
    assert len(llm.log()) == asked  # no model was asked: every turn came from the journal
    report = result["replay"]
    assert report["of"] == source["job_id"] and report["identical"] is True, report
    assert report["observations_checked"] == TURNS - 1 and report["turns_replayed"] == TURNS
    assert report["reward_then"] == report["reward_now"] == result["reward"] == 1.0
    for field in ("prompt_ids", "response_ids", "response_logprobs", "response_mask"):
        assert result["trajectory"][field] == source["trajectory"][field], field
    assert result["trajectory"]["backend"] == "journal"


@pytest.mark.extended  # kept out of the default run's 10 minutes; CI's extended phase runs it
def test_replay_names_the_observation_that_differs_and_the_cli_says_so(cluster, llm, qwen3_hf_tokenizer):
    llm.reset()
    with Gateway(cluster) as gateway:
        source = finished_job(gateway, "RESUME-CLOCK", 11)
        steady = finished_job(gateway, "RESUME-STATEFUL", 12)
        missing = gateway.post("/jobs/no-such-job/replay")
        assert missing.status_code == 404, missing.text
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    replay = subprocess.run([sys.executable, "-m", "prorl_celery.cli", "replay", source["job_id"], steady["job_id"],
                             "--gateway", cluster.gateway_url, "--json"],
                            capture_output=True, text=True, timeout=300, env=env)
    assert replay.returncode == 1, replay.stderr  # a replay differs
    clock, stateful = (json.loads(line) for line in replay.stdout.splitlines())
    differences = clock["replay"]["differences"]
    assert [(d["turn"], d["kind"]) for d in differences] == [(3, "observation")], differences
    assert clock["replay"]["observations_differing"] == 1 and clock["replay"]["observations_checked"] == TURNS - 1
    assert stateful["replay"]["identical"] is True
    lines = subprocess.run([sys.executable, "-m", "prorl_celery.cli", "replay", source["job_id"], "--gateway",
                            cluster.gateway_url], capture_output=True, text=True, timeout=300, env=env)
    assert "1 differ" in lines.stdout and "after turn 3: observation" in lines.stdout, lines.stdout
    unknown = subprocess.run([sys.executable, "-m", "prorl_celery.cli", "replay", "no-such-job", "--gateway",
                              cluster.gateway_url], capture_output=True, text=True, timeout=120, env=env)
    assert unknown.returncode == 1 and len(unknown.stderr.strip().splitlines()) == 1, unknown.stderr
    assert "no job with id 'no-such-job'" in unknown.stderr


def test_forks_share_the_first_turns_and_never_generate_them_again(cluster, llm, second_llm, qwen3_hf_tokenizer):
    llm.reset()
    k, n = 3, 3
    with Gateway(cluster) as gateway:
        source = finished_job(gateway, "RESUME-STATEFUL", 13)
        served_source = len(requests_of(llm, "RESUME-STATEFUL", 13, qwen3_hf_tokenizer))
        # an idle backend: the least-assigned routing would send the forks there
        assert gateway.post("/add_llm_server", json={"address": second_llm.address()}).status_code == 200
        try:
            accepted = gateway.post(f"/jobs/{source['job_id']}/fork", json={"turn": k, "count": n})
            assert accepted.status_code == 202, accepted.text
            group = accepted.json()
            forks = [gateway.result(job["job_id"], wait=120) for job in group["jobs"]]
        finally:
            gateway.post("/clear_llm_server", json={"address": second_llm.address()})
        too_far = gateway.post(f"/jobs/{source['job_id']}/fork", json={"turn": TURNS + 1, "count": 1})
        assert too_far.status_code == 400 and "journaled turns" in too_far.json()["message"]
    assert served_source == TURNS
    source_turns = source["trajectory"]["turns"]
    shared = source_turns[k]["context_len"]  # prompt and response ids of turns 1..k and their observations
    source_ids = source["trajectory"]["prompt_ids"] + source["trajectory"]["response_ids"]
    for fork in forks:
        assert fork["status"] == "completed" and fork["reward"] == 1.0, fork["error"]
        assert fork["fork"]["group"] == group["group_id"] and fork["fork"]["shared_turns"] == k, fork["fork"]
        assert fork["backend"] == source["backend"]  # where the shared prefix is cached
        ids = fork["trajectory"]["prompt_ids"] + fork["trajectory"]["response_ids"]
        assert ids[:shared] == source_ids[:shared]
        assert fork["trajectory"]["turns"][:k] == source_turns[:k]
    # each fork asked the model only for its own turns, k + 1 .. TURNS
    assert len(requests_of(llm, "RESUME-STATEFUL", 13, qwen3_hf_tokenizer)) == TURNS + n * (TURNS - k)


def test_a_fork_whose_shared_observation_differs_starts_again_and_shares_nothing(cluster, llm, qwen3_hf_tokenizer):
    """A fork at turn 5 of the job whose tool prints the time meets a different observation
    after turn 3: it starts again from turn zero, and its report says it shares nothing (a
    trainer masks a fork's shared turns by that count: prorl_celery.trainer.samples)."""
    llm.reset()
    with Gateway(cluster) as gateway:
        source = finished_job(gateway, "RESUME-CLOCK", 14)
        accepted = gateway.post(f"/jobs/{source['job_id']}/fork", json={"turn": 5, "count": 1, "group_id": "clock"})
        assert accepted.status_code == 202, accepted.text
        fork = gateway.result("clock-0", wait=120)
    assert fork["status"] == "completed", fork["error"]
    assert fork["resume"]["restarted"] is True and fork["resume"]["diverged_at_turn"] == 3, fork["resume"]
    assert fork["fork"]["shared_turns"] == 0 and fork["fork"]["shared_tokens"] == 0, fork["fork"]
    assert fork["fork"]["restarted"] is True and fork["trajectory"]["num_turns"] == TURNS
    assert len(requests_of(llm, "RESUME-CLOCK", 14, qwen3_hf_tokenizer)) == 2 * TURNS  # every turn generated again
