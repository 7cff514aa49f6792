"""The swe task through the service: the gateway app (in this process), real Celery workers,
Redis, bubblewrap sandboxes and a scripted LLM server (real Qwen3 token ids). INIT clones the
instance's bundle at its base commit, the scripted agent edits the code with the editor and
checks it with bash, RUN takes the git diff as the patch, and EVAL runs the hidden tests in a
fresh sandbox."""
from __future__ import annotations

import json

import pytest
import redis

from prorl_celery.state import keys
from tests.support.services import rules_file, start_llm_server
from tests.support.swe import ROMANUM, RULES, SEMVER

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def gateway(app_gateway):
    """This module's gateway is the app in this process (Flask's test client)."""
    return app_gateway


@pytest.fixture(scope="module")
def swe_llm(qwen3_tokenizer, tmp_path_factory):
    server = start_llm_server(qwen3_tokenizer, tmp_path_factory.mktemp("swe-llm"), "swe-llm", rules=rules_file(RULES))
    yield server
    server.process.stop()


@pytest.fixture
def service(gateway, swe_llm):
    assert gateway.post("/add_llm_server", json={"address": swe_llm.address()}).status_code == 200
    return gateway


def test_fix_resolves_and_wrong_fix_does_not(service):
    # the wrong fix comes as a verl row (SWE-Gym style): prompt + extra_info with the SWE fields
    verl = {"data_source": "swe_gym", "extra_info": {k: v for k, v in SEMVER.items() if k != "patch"},
            "prompt": [{"role": "user", "content": f"E2E-SEMVER-WRONG\n{SEMVER['problem_statement']}"}],
            "reward_model": {"style": "rule", "ground_truth": SEMVER["patch"]}}
    good_id = service.submit({**ROMANUM, "data_source": "swe_bench"})
    wrong_id = service.submit(verl)

    good = service.result(good_id, wait=180)
    assert (good["status"], good["reward"], good["critical_error"]) == ("completed", 1.0, None), good["error"]
    # the agent's edit is the gold fix, so its git diff is the gold patch, byte for byte
    assert good["artifacts"] == {"patch": ROMANUM["patch"]}
    assert good["eval"]["resolved"] and good["eval"]["patch_applied"]
    f2p, p2p = json.loads(ROMANUM["FAIL_TO_PASS"]), json.loads(ROMANUM["PASS_TO_PASS"])
    assert good["eval"]["report"] == {"FAIL_TO_PASS": {"success": f2p, "failure": []},
                                      "PASS_TO_PASS": {"success": p2p, "failure": []}}
    tools = [m["content"] for m in good["messages"] if m["role"] == "tool"]
    assert "(1000, \"M\")" in tools[0] and "MCMXCIV 1994" in tools[2]
    assert good["trajectory"]["num_turns"] == 4
    assert [t["function"]["name"] for t in good["trajectory"]["tools"]] == ["bash", "editor", "finish"]
    # the agent never saw the hidden tests
    assert "test_to_roman_nine_hundreds" not in json.dumps(good["messages"])

    wrong = service.result(wrong_id, wait=180)
    assert (wrong["status"], wrong["reward"], wrong["critical_error"]) == ("completed", 0.0, None), wrong["error"]
    patch = wrong["artifacts"]["patch"]
    assert "+        return -1 if len(x) < len(y) else 1" in patch and patch.startswith("diff --git a/semverlite/")
    report = wrong["eval"]["report"]
    assert wrong["eval"]["patch_applied"] and not wrong["eval"]["resolved"]
    assert report["FAIL_TO_PASS"]["failure"] == []  # the numeric cases pass now...
    assert "tests/test_version.py::test_spec_example_ordering" in report["PASS_TO_PASS"]["failure"]  # ...at a price
    assert wrong["eval"]["tests"]["tests/test_version.py::test_spec_example_ordering"] == "failed"

    # both sandboxes of each job (the agent's and EVAL's) are gone
    state = redis.Redis.from_url(service.cluster.state_url, decode_responses=True)
    for result in (good, wrong):
        sandbox = json.loads(state.hget(keys.job(result["job_id"]), "sandbox"))
        assert state.hlen(keys.node_sandboxes(sandbox["node"])) == 0


def test_unknown_repository_is_a_400(service):
    response = service.post("/jobs", json={"instance": {**ROMANUM, "data_source": "swe", "repo": "acme/rocket"}})
    assert response.status_code == 400
    assert "no git bundle for 'acme/rocket'" in response.json["message"]
