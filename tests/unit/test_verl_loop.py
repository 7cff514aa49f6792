"""The verl agent loop (``prorl_celery.trainer.integrations.verl``) against an in-memory gateway: a reward
that is not valid is resubmitted, and one that stays invalid stops the step by name; it never
becomes verl's ``reward_score``. verl (its own venv) is not needed: the three names the adapter
imports from it are stood in for by plain classes (the real loop runs in test_vllm_real.py)."""
from __future__ import annotations

import importlib
import sys
import types
from types import SimpleNamespace
from typing import Any

import pytest

from prorl_celery.trainer.client import RewardInvalid
from tests.support.fake_gateway import FakeGateway


class Output(SimpleNamespace):
    """verl's AgentLoopOutput and AgentLoopMetrics, as keyword fields."""


@pytest.fixture
def adapter(monkeypatch):
    stub = types.ModuleType("verl.experimental.agent_loop.agent_loop")
    stub.AgentLoopBase = type("AgentLoopBase", (), {})
    stub.AgentLoopMetrics = stub.AgentLoopOutput = Output
    stub.register = lambda name: (lambda cls: cls)
    for name in ("verl", "verl.experimental", "verl.experimental.agent_loop"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, stub.__name__, stub)
    monkeypatch.delitem(sys.modules, "prorl_celery.trainer.integrations.verl", raising=False)
    module = importlib.import_module("prorl_celery.trainer.integrations.verl")
    yield module
    sys.modules.pop("prorl_celery.trainer.integrations.verl", None)  # built on the stand-ins: never reused
    vars(importlib.import_module("prorl_celery.trainer.integrations")).pop("verl", None)


def planned(body: dict[str, Any]) -> tuple[str, float, float]:
    """The ``k``-th resubmission ends as ``plan[k]`` (the last entry from then on)."""
    plan, job_id = body["instance"]["plan"], body["job_id"]
    attempt = int(job_id.rsplit("-re", 1)[1]) if "-re" in job_id else 0
    ending = plan[min(attempt, len(plan) - 1)]
    return ending, 1.0 if ending == "ok" else 0.0, 0.0


def agent_loop(adapter, fake: FakeGateway, max_resubmits: int):
    loop = adapter.ProrlAgentLoop()  # what verl's hydra.instantiate sets, for the adapter's reads
    loop.config = {"prorl": {"gateway_url": "http://gw", "max_resubmits": max_resubmits}}
    loop.rollout_config = SimpleNamespace(response_length=16)
    loop.tokenizer = None
    loop.transport = fake.transport
    return loop


def row(plan: list[str]) -> dict[str, Any]:
    return {"agent_name": "prorl", "data_source": "fake", "index": 0, "tokens": 3, "plan": plan,
            "raw_prompt": [{"role": "user", "content": "q"}]}


@pytest.mark.anyio
async def test_an_invalid_reward_is_resubmitted_and_the_valid_one_returned(adapter, monkeypatch):
    monkeypatch.delenv("PRORL_GATEWAY_URL", raising=False)
    monkeypatch.delenv("PRORL_MAX_RESUBMITS", raising=False)
    fake = FakeGateway(planned)
    output = await agent_loop(adapter, fake, 2).run({"temperature": 1.0}, **row(["eval_error", "ok"]))
    assert output.reward_score == 1.0 and output.response_mask == [1, 1, 1]
    assert output.extra_fields["prorl_outcome"] == "ok" and output.extra_fields["prorl_resubmits"] == 1
    assert output.extra_fields["prorl_job_id"].endswith("-re1") and len(fake.jobs) == 2
    [only] = output.extra_fields["prorl_samples"]  # every training sample rides along: here one
    assert (only["origin"], only["primary"], only["reward"]) == ("main", True, 1.0)
    assert only["response_ids"] == output.response_ids and only["response_mask"] == output.response_mask


@pytest.mark.anyio
async def test_a_reward_still_invalid_stops_the_step_by_name(adapter, monkeypatch):
    monkeypatch.delenv("PRORL_GATEWAY_URL", raising=False)
    monkeypatch.setenv("PRORL_MAX_RESUBMITS", "1")  # the environment wins over the config's 5
    fake = FakeGateway(planned)
    with pytest.raises(RewardInvalid, match="after 1 resubmissions .* ended backend_error in run: scripted") as caught:
        await agent_loop(adapter, fake, 5).run({}, **row(["env_error", "backend_error"]))
    assert caught.value.outcome.outcome == "backend_error" and len(fake.jobs) == 2


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
