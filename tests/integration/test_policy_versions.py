"""Policy versions through the service (the gateway app in this process, real workers, Redis and
LLM server): the trainer sets a backend's version, every model turn records the version that
produced it, and a turn generated across an update says so."""
from __future__ import annotations

import pytest

from tests.support.services import eventually, rules_file, start_llm_server

RULES = [{"match": "VSPAN", "scope": "prompt", "delay_s": 1.0,
          "replies": ["First thought.", "Second thought.", "So \\boxed{6}."]},
         {"match": "VQUICK", "scope": "prompt", "replies": ["\\boxed{6}"]}]


@pytest.fixture
def gateway(app_gateway):
    """This module's gateway is the app in this process (Flask's test client)."""
    return app_gateway


@pytest.fixture(scope="module")
def versioned_llm(qwen3_tokenizer, tmp_path_factory):
    server = start_llm_server(qwen3_tokenizer, tmp_path_factory.mktemp("versions"), "versions",
                              rules=rules_file(RULES))
    yield server
    server.process.stop()


def job(tag: str) -> dict:
    return {"data_source": "math", "problem": f"{tag}: what is 3 + 3?", "answer": "6", "max_iterations": 3}


def test_turns_record_the_version_that_produced_them(gateway, versioned_llm):
    versioned_llm.reset()
    added = gateway.post("/add_llm_server", json={"address": versioned_llm.address(), "version": 1}).json
    assert added["version"] == 1
    job_id = gateway.submit(job("VSPAN"))
    # the second turn is being generated: the trainer loads new weights now
    eventually(lambda: len(versioned_llm.log()) == 2, 30, "the second turn's request")
    # the bare host:port names the same server as .../v1
    assert gateway.post("/llm_servers/version", json={"version": 2, "address": versioned_llm.base}).json == \
        {"versions": {versioned_llm.address(): 2}}
    result = gateway.result(job_id)
    turns = result["trajectory"]["turns"]
    assert [t["policy_version"] for t in turns] == [1, 2, 2]
    assert "spans_update" not in turns[0] and "spans_update" not in turns[2]
    assert turns[1]["spans_update"] and turns[1]["policy_version_start"] == 1
    assert result["trajectory"]["policy_versions"] == [1, 2] and result["trajectory"]["on_policy"] is False
    assert result["reward"] == 1.0

    after = gateway.process(job("VQUICK"))
    assert after["trajectory"]["policy_versions"] == [2] and after["trajectory"]["on_policy"] is True
    listed = gateway.get("/llm_servers").json["servers"]
    assert [s["version"] for s in listed] == [2]


def test_setting_a_version_names_a_registered_server(gateway, versioned_llm):
    assert gateway.post("/llm_servers/version", json={"version": 1}).json == {"versions": {}}
    assert gateway.post("/add_llm_server", json={"address": versioned_llm.address()}).status_code == 200
    response = gateway.post("/llm_servers/version", json={"version": 3, "address": "http://127.0.0.1:1/v1"})
    assert response.status_code == 400 and "is not a registered LLM server" in response.json["message"]
    assert gateway.post("/llm_servers/version", json={"version": -1}).status_code == 400
    unversioned = gateway.process(job("VQUICK"))
    assert unversioned["trajectory"]["policy_versions"] == [] and unversioned["trajectory"]["on_policy"] is None
