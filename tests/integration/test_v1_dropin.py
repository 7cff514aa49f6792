"""Trainers written against ProRL Agent Server v1, unchanged, against the real service.

``NemoRLProRLClient`` is written here in the shape of NeMo-RL's ProRL environment
(``nemo_rl/environments/prorl_environment.py``): its sequence of calls (clear and add the LLM
servers once, then ``/start``, concurrent ``/process`` without job ids, retries on a non-200 or
empty ``messages``, ``/stop`` per batch), its ``sampling_params`` and its result handling
(prompt ids from the ``token_ids`` of every message before the first assistant message,
response ids from the rest, logprobs from assistant messages, ``score`` as the reward). The
NeMo-Gym test sends ``prorl_agent``'s request shape. Both run against gunicorn, Celery workers,
Redis and a scripted LLM server that logs every key it receives.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from prorl_celery.llm.sampling import SAMPLER_KEYS, TRAINER_KEYS
from tests.support.services import rules_file, start_llm_server
from tests.support.swe import ROMANUM
from tests.support.swe import RULES as SWE_RULES

pytestmark = pytest.mark.timeout(420)

LONG = " ".join(f"word{i}" for i in range(400))
TOOL_CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "print(6 * 7)"}}\n</tool_call>'
RULES = [
    {"match": "V1-ONE", "scope": "prompt", "replies": ["Adding gives \\boxed{5}."]},
    {"match": "V1-WRONG", "scope": "prompt", "replies": ["I believe it is \\boxed{9}."]},
    {"match": "V1-MULTI", "scope": "prompt", "replies": ["Let me think.", "Still thinking.", "So it is \\boxed{6}."]},
    {"match": "V1-TOOL", "scope": "prompt", "replies": [f"Let me compute it.\n{TOOL_CALL}",
                                                        "It printed 42, so the answer is \\boxed{42}."]},
    {"match": "V1-LONG", "scope": "prompt", "replies": [LONG]},
    *SWE_RULES,
]

#: NeMo-RL's sampling_params for a ProRL environment (token-level generation, Qwen3)
NEMO_RL_SAMPLING = {
    "model": "hosted_vllm/Qwen/Qwen3-4B", "api_key": "dummy_key", "modify_params": False,
    "log_completions": False, "native_tool_calling": True, "temperature": 1.0, "top_p": 1.0,
    "max_iterations": 2, "max_input_tokens": 2048, "max_output_tokens": 200, "token_level_generation": True,
    "custom_tokenizer": "Qwen/Qwen3-4B", "max_model_len": 8192, "ensure_thinking_end_properly": False,
    "strict_loop_detector": True, "is_reasoning_task": False,
}
#: keys each protocol's adapter adds itself (prompt, logprob and format switches)
PROTOCOL_KEYS = {
    "vllm": {"model", "prompt", "logprobs", "return_token_ids", "n", "stream"},
    "sglang": {"input_ids", "return_logprob", "sampling_params.max_new_tokens", "sampling_params.sampling_seed",
               "sampling_params.min_new_tokens"},
    "llamacpp": {"prompt", "n_probs", "return_tokens", "cache_prompt", "stream", "n_predict", "repeat_penalty"},
}


def math_row(question: str, answer: str, index: int) -> dict[str, Any]:
    """A DeepScaleR row as NeMo-RL's run_prorl.format_instance passes it."""
    return {"data_source": "deepscaler", "instance_id": f"deepscaler_math_train_{index}",
            "prompt": [{"role": "user", "content": question}],
            "reward_model": {"style": "rule", "ground_truth": answer}, "extra_info": {"index": index}}


@dataclass
class Trajectory:
    """One row of NeMo-RL's batch, built from a result exactly as its environment builds it."""

    result: dict[str, Any]
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    token_loss_mask: list[int] = field(default_factory=list)
    generation_logprobs: list[float] = field(default_factory=list)

    @classmethod
    def from_result(cls, result: dict[str, Any]) -> Trajectory:
        messages = result["messages"]
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
        row = cls(result)
        for index, message in enumerate(messages):
            ids = list(message["token_ids"])  # KeyError, as in NeMo-RL, if any message lacks them
            if index < first or first == 0:
                row.prompt_ids += ids
                continue
            row.response_ids += ids
            assistant = message["role"] == "assistant"
            row.token_loss_mask += [int(assistant)] * len(ids)
            logprobs = message.get("logprobs")
            row.generation_logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)
        return row

    @property
    def total_reward(self) -> float:
        return float(self.result.get("score", 0.0))

    @property
    def truncated(self) -> bool:
        return not self.result.get("end_properly", False)


class NemoRLProRLClient:
    """The ProRL environment's calls, in its order, with its retry and concurrency rules."""

    def __init__(self, prorl_url: str, llm_addresses: list[str], sampling_params: dict[str, Any],
                 num_workers: int = 8) -> None:
        self.url, self.sampling_params, self.num_workers = prorl_url, sampling_params, num_workers
        with httpx.Client(timeout=30) as client:  # once, at construction
            assert client.post(f"{self.url}/clear_llm_server").status_code == 200
            for address in llm_addresses:
                client.post(f"{self.url}/add_llm_server", json={"address": address})

    def rollout(self, rows: list[dict[str, Any]], num_generations: int) -> list[Trajectory]:
        return asyncio.run(self._rollout(rows, num_generations))

    async def _rollout(self, rows: list[dict[str, Any]], num_generations: int) -> list[Trajectory]:
        async with httpx.AsyncClient(timeout=None) as client:
            await client.post(f"{self.url}/start")
            try:
                slots = asyncio.Semaphore(self.num_workers)
                jobs = [({**row, "trajectory_id": j}) for row in rows for j in range(num_generations)]
                results = await asyncio.gather(*(self._process(client, slots, instance) for instance in jobs))
            finally:
                await client.post(f"{self.url}/stop")
        return [Trajectory.from_result(result) for result in results]

    async def _process(self, client: httpx.AsyncClient, slots: asyncio.Semaphore,
                       instance: dict[str, Any]) -> dict[str, Any]:
        for _ in range(3):  # NeMo-RL retries a non-200 or an empty result, three attempts in all
            async with slots:
                response = await client.post(f"{self.url}/process",
                                             json={"instance": instance, "sampling_params": self.sampling_params})
            if response.status_code == 200 and response.json().get("messages"):
                return response.json()
        return {"error": "Empty response", "messages": [], "score": 0.0, "success": False, "resolved": False,
                "finish": False}


@pytest.fixture(scope="module")
def v1_llm(qwen3_tokenizer, tmp_path_factory):
    server = start_llm_server(qwen3_tokenizer, tmp_path_factory.mktemp("v1-llm"), "v1-llm", rules=rules_file(RULES))
    yield server
    server.process.stop()


def served_turns(server) -> list[dict[str, Any]]:
    return server.log()


def assert_exact(trajectory: Trajectory, turns: list[dict[str, Any]]) -> int:
    """Every assistant message is one request the backend served: its context is the ids of
    the messages before it, its ids and logprobs what the backend produced. Returns the turns."""
    result = trajectory.result
    assert trajectory.prompt_ids + trajectory.response_ids == \
        result["trajectory"]["prompt_ids"] + result["trajectory"]["response_ids"]
    assert len(trajectory.response_ids) == len(trajectory.token_loss_mask) == len(trajectory.generation_logprobs)
    assert trajectory.token_loss_mask == result["trajectory"]["response_mask"]
    context: list[int] = []
    checked = 0
    for message in result["messages"]:
        if message["role"] == "assistant":
            served = [t for t in turns if t["prompt_ids"] == context and t["output_ids"] == message["token_ids"]]
            assert served, f"no backend request matches assistant turn {checked + 1} of {result['job_id']}"
            assert message["logprobs"] == served[0]["logprobs"] and message["input_ids"] == context
            checked += 1
        context = context + message["token_ids"]
    return checked


def assert_only_allowed_keys(turns: list[dict[str, Any]], protocol: str) -> None:
    """What the server received is the protocol's allow-list and the adapter's own switches;
    so no trainer-side or agent key (SAMPLER_KEYS holds none, test_sampling_split checks)."""
    assert turns
    sampler = SAMPLER_KEYS[protocol]
    allowed = PROTOCOL_KEYS[protocol] | ({f"sampling_params.{k}" for k in sampler} if protocol == "sglang" else sampler)
    for turn in turns:
        received = set(turn["request_keys"])
        assert received <= allowed, received - allowed
        assert {"temperature", "top_p"} <= {key.split(".")[-1] for key in received}  # sampler keys do arrive


def test_nemo_rl_prorl_environment_trains_on_two_batches(gateway, v1_llm):
    v1_llm.reset()
    client = NemoRLProRLClient(gateway.cluster.gateway_url, [v1_llm.base], NEMO_RL_SAMPLING)

    # batch 1: math, one-turn right and wrong, multi-turn (cut by max_iterations 2), a python
    # tool call, and a reply longer than max_output_tokens
    rows = [math_row("V1-ONE What is 2 + 3?", "5", 0), math_row("V1-WRONG What is 4 + 4?", "8", 1),
            math_row("V1-MULTI What is 3 + 3?", "6", 2), {**math_row("V1-TOOL What is 6 * 7?", "42", 3),
                                                          "tools": ["python"]},
            math_row("V1-LONG Count.", "0", 4)]
    batch = {t.result["instance_id"]: t for t in client.rollout(rows, num_generations=2)}
    assert len(batch) == 5
    turns = served_turns(v1_llm)

    one, wrong, multi, tool, long = (batch[f"deepscaler_math_train_{i}"] for i in range(5))
    assert (one.total_reward, one.result["resolved"], one.result["finish"], one.truncated) == (1.0, True, True, False)
    assert (wrong.total_reward, wrong.result["resolved"], wrong.result["finish"]) == (0.0, False, True)
    assert multi.result["trajectory"]["num_turns"] == 2 and multi.total_reward == 0.0  # max_iterations obeyed
    assert not multi.result["finish"] and multi.result["success"] and not multi.result["filter"]
    assert [m["role"] for m in multi.result["messages"]] == ["user", "assistant", "user", "assistant"]
    assert tool.total_reward == 1.0
    tool_messages = tool.result["messages"]
    assert [m["role"] for m in tool_messages] == ["user", "assistant", "tool", "assistant"]
    call = tool_messages[1]["tool_calls"][0]
    assert (call["name"], json.loads(call["arguments"])) == ("python", {"code": "print(6 * 7)"})
    assert tool_messages[2]["tool_call_id"] == call["id"] and "42" in tool_messages[2]["content"]
    assert [t["function"]["name"] for t in tool.result["tools"]] == ["python"]
    assert long.truncated and long.result["trajectory"]["num_turns"] == 2  # max_output_tokens obeyed
    assert [len(m["token_ids"]) for m in long.result["messages"] if m["role"] == "assistant"] == [200, 200]
    assert all(t["max_tokens"] <= 200 for t in turns)
    checked = sum(assert_exact(t, turns) for t in batch.values())
    assert checked >= 8
    assert_only_allowed_keys(turns, "vllm")
    ignored = set(one.result["ignored_sampling_params"])
    assert ignored == TRAINER_KEYS, ignored

    # batch 2: swe (tools, a patch, hidden tests) and math again, after /stop and /start
    v1_llm.reset()
    swe = {**ROMANUM, "data_source": "swebench"}
    second = client.rollout([swe, math_row("V1-ONE What is 2 + 3?", "5", 5)], num_generations=1)
    turns = served_turns(v1_llm)
    fix, again = second
    # max_iterations 2 cuts the scripted agent after its edit (turn 2), before it checks and finishes
    assert fix.result["trajectory"]["num_turns"] == 2 and not fix.result["finish"]
    assert (fix.total_reward, fix.result["resolved"]) == (1.0, True), fix.result["error"]
    assert fix.result["git_patch"] == ROMANUM["patch"]
    finished = client.rollout([{**swe, "max_iterations": 4}], num_generations=1)[0]  # the instance's wins
    assert finished.result["trajectory"]["num_turns"] == 4 and finished.result["finish"]
    assert finished.total_reward == 1.0 and finished.result["resolved"]
    assert_exact(finished, served_turns(v1_llm))
    assert again.total_reward == 1.0
    assert assert_exact(fix, turns) == 2 and assert_exact(again, turns) == 1
    assert_only_allowed_keys(served_turns(v1_llm), "vllm")


@pytest.mark.parametrize("protocol", ["sglang", "llamacpp"])
def test_no_trainer_key_reaches_sglang_or_llamacpp(gateway, v1_llm, protocol):
    v1_llm.reset()
    gateway.post("/add_llm_server", json={"address": v1_llm.base, "type": protocol}).raise_for_status()
    sampling = {**NEMO_RL_SAMPLING, "top_k": 20, "seed": 3, "stop_token_ids": [151643], "presence_penalty": 0.0}
    result = gateway.process({**math_row("V1-ONE What is 2 + 3?", "5", 0), "trajectory_id": 0},
                             sampling_params=sampling)
    assert result["score"] == 1.0
    turns = served_turns(v1_llm)
    assert len(turns) == 1 and turns[0]["protocol"] == protocol
    assert_only_allowed_keys(turns, protocol)
    expected_dropped = {"llamacpp": {"stop_token_ids"}, "sglang": set()}[protocol]
    assert set(result["ignored_sampling_params"]) == TRAINER_KEYS | expected_dropped
    assert_exact(Trajectory.from_result(result), turns)


def test_nemo_gym_prorl_agent_request_shape(gateway, v1_llm):
    v1_llm.reset()
    assert gateway.post("/start").status_code in (200, 400)  # 400 would mean "already running"
    gateway.post("/add_llm_server", json={"address": f"{v1_llm.base}/v1"}).raise_for_status()
    instance = {**math_row("V1-TOOL What is 6 * 7?", "42", 9), "tools": ["python"], "max_iterations": 3}
    body = {"instance": instance, "sampling_params": {"temperature": 1.0, "top_p": 1.0, "max_output_tokens": 120},
            "job_id": instance["instance_id"]}
    response = gateway.post("/process", json=body)
    response.raise_for_status()
    result = response.json()
    reward = 1.0 if result["resolved"] else 0.0
    assert reward == 1.0 and result["success"] and result["end_properly"] and not result["filter"]
    assert result["critical_error"] is None and result["error"] is None and result.get("git_patch") is None
    generations = [m for m in result["messages"] if m["role"] == "assistant"]
    assert all(len(m["token_ids"]) == len(m["logprobs"]) > 0 for m in generations)
    assert result["ignored_sampling_params"] == []
    assert_exact(Trajectory.from_result(result), served_turns(v1_llm))
    assert all(t["max_tokens"] <= 120 for t in served_turns(v1_llm))


def test_status_counts_pending_jobs(gateway, v1_llm):
    assert gateway.get("/status").json()["pending_jobs"] == 0
    job_id = gateway.submit(math_row("V1-ONE What is 2 + 3?", "5", 0))  # no backend: it waits in RUN
    status = gateway.get("/status").json()
    assert status["pending_jobs"] == 1 and status["status"] == "running"
    gateway.post("/cancel", json={"job_id": job_id}).raise_for_status()
    assert gateway.get("/status").json()["pending_jobs"] == 0


def test_unresolvable_custom_tokenizer_is_a_400_when_a_tokenizers_dir_is_set(gateway):
    response = gateway.post("/jobs", json={"instance": math_row("q", "1", 0),
                                           "sampling_params": {"custom_tokenizer": "acme/unknown-7b"}})
    assert response.status_code == 400
    assert "custom_tokenizer: 'acme/unknown-7b' is not a directory nor under PRORL_TOKENIZERS_DIR" in \
        response.json()["message"]
