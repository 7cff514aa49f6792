"""The stem task end to end: the gateway app (in this process), real Celery workers, bubblewrap
sandboxes with the shipped corpus bound in and indexed by the tool server's BM25, and a scripted
LLM server (real Qwen3 ids)."""
from __future__ import annotations

import json

import pytest

from handlers.stem import DATA_DIR, StemHandler
from handlers.tool_calls import tool_call
from tests.support.services import rules_file, start_llm_server

RULES = [
    {"match": r"molar mass of water \(H2O\)", "scope": "prompt", "replies": [
        "I need the atomic weights of hydrogen and oxygen.\n"
        + tool_call("search", query="hydrogen oxygen standard atomic weight", k=3),
        "The reference gives 1.008 for hydrogen and 15.999 for oxygen.\n"
        + tool_call("python", code="print(round(2 * 1.008 + 15.999, 3))"),
        tool_call("finish", answer="18.015 g/mol"),
    ]},
    {"match": r"How many bones does an adult", "scope": "prompt", "replies": [
        tool_call("search", query="adult human skeleton bones", k=3),
        tool_call("finish", answer="204"),
    ]},
    {"match": r"STEM-VERL", "scope": "prompt", "replies": [
        tool_call("search", query="largest moon Solar System", k=3),
        "The passage on Ganymede says it is the largest moon in the Solar System.\nAnswer: Ganymede",
    ]},
]


def passage(doc_id: str) -> dict:
    with open(DATA_DIR / "corpus.jsonl", encoding="utf-8") as handle:
        return next(doc for doc in map(json.loads, handle) if doc["id"] == doc_id)


def question(question_id: str) -> dict:
    with open(DATA_DIR / "questions.jsonl", encoding="utf-8") as handle:
        return next(row for row in map(json.loads, handle) if row["id"] == question_id)


@pytest.fixture
def gateway(app_gateway):
    """This module's gateway is the app in this process (Flask's test client)."""
    return app_gateway


@pytest.fixture(scope="module")
def stem_llm(qwen3_tokenizer, tmp_path_factory):
    server = start_llm_server(qwen3_tokenizer, tmp_path_factory.mktemp("stem-llm"), "stem-llm",
                              rules=rules_file(RULES))
    yield server
    server.process.stop()


@pytest.fixture
def backend(gateway, stem_llm):
    stem_llm.reset()
    assert gateway.post("/add_llm_server", json={"address": stem_llm.address()}).status_code == 200
    return stem_llm


def tool_messages(result: dict) -> list[str]:
    return [m["content"] for m in result["messages"] if m["role"] == "tool"]


def test_search_python_finish_right_and_wrong_answers(gateway, backend):
    water, bones = question("stem-001"), question("stem-014")
    assert "molar mass of water (H2O)" in water["question"] and "How many bones does an adult" in bones["question"]
    verl_row = {"data_source": "scienceqa", "instance_id": "verl-1",
                "prompt": [{"role": "user", "content": "STEM-VERL: What is the largest moon in the Solar System? "
                                                       "End with a line 'Answer: <name>'."}],
                "reward_model": {"style": "rule", "ground_truth": "Ganymede"}, "extra_info": {"index": 0}}
    jobs = {name: gateway.submit(instance) for name, instance in (
        ("right", {"data_source": "stem", **water}), ("wrong", {"data_source": "stem", **bones}),
        ("verl", verl_row))}
    right, wrong, verl = (gateway.result(jobs[name], wait=90) for name in ("right", "wrong", "verl"))

    # searched, read the passages, computed with python, finished with the right answer
    assert (right["status"], right["reward"], right["task"]) == ("completed", 1.0, "stem"), right["error"]
    observations = tool_messages(right)
    assert len(observations) == 3 and right["trajectory"]["num_turns"] == 3
    assert passage("element-hydrogen")["text"] in observations[0]
    assert passage("element-oxygen")["text"] in observations[0]
    assert observations[1].strip() == "18.015"
    assert right["eval"]["match"] == "numeric" and right["eval"]["normalized_prediction"] == "18.015"
    assert right["eval"]["gold"] == [water["answer"]]
    artifacts = right["artifacts"]
    assert {key: artifacts[key] for key in ("answer", "finish_reason", "iterations", "tool_calls", "tool_errors")} \
        == {"answer": "18.015 g/mol", "finish_reason": "finish", "iterations": 3, "tool_calls": 3, "tool_errors": 0}
    # INIT built the BM25 index in the sandbox (import bm25s + index the corpus), so the agent's
    # first search is a warm one
    first_search = artifacts["tool_log"][0]
    assert first_search["name"] == "search" and 0 < artifacts["index_warmup_s"] < StemHandler.tool_timeout_s
    print(f"index warm-up in INIT {artifacts['index_warmup_s']:.2f} s, agent's first search "
          f"{first_search['seconds']:.3f} s")
    tools = {tool["function"]["name"] for tool in right["trajectory"]["tools"]}
    assert tools == {"search", "python", "finish"}

    # the same loop with a wrong final number: reward 0, and the details say why
    assert (wrong["status"], wrong["reward"]) == ("completed", 0.0), wrong["error"]
    assert passage("bio-skeleton")["text"] in tool_messages(wrong)[0]
    assert (wrong["eval"]["match"], wrong["eval"]["normalized_prediction"], wrong["eval"]["gold"]) == (
        "none", "204", ["206"])

    # a verl row routed by its data_source alias, answered in text instead of the finish tool
    assert (verl["status"], verl["reward"], verl["task"]) == ("completed", 1.0, "stem"), verl["error"]
    assert passage("astro-ganymede")["text"] in tool_messages(verl)[0]
    assert verl["artifacts"]["finish_reason"] == "answer" and verl["eval"]["match"] == "exact"


def test_bad_stem_instance_is_a_400_naming_the_field(gateway):
    response = gateway.post("/jobs", json={"instance": {"data_source": "stem", "question": "q", "answer": "x",
                                                        "tolerance": "1%"}})
    assert response.status_code == 400 and "'tolerance'" in response.json["message"], response.text
