"""A task family from a separately installed package reaches the service through its entry point
alone: pip installs examples/handler_package into a directory of its own, and a fresh gateway and
workers that have that directory on their path serve its task, with no change to the service."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from prorl_celery.core.status import Stage
from prorl_celery.dev.local import LocalCluster
from tests.support.services import ROOT, rules_file, start_llm_server

PACKAGE = ROOT / "examples" / "handler_package"


def bash_then_finish(command: str, answer: str) -> list[str]:
    call = {"name": "bash", "arguments": {"command": command}}
    finish = {"name": "finish", "arguments": {"answer": answer}}
    return [f"<tool_call>\n{json.dumps(call)}\n</tool_call>", f"<tool_call>\n{json.dumps(finish)}\n</tool_call>"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(PACKAGE)], check=True)
    assert (target / "prorl_wordcount" / "handler.py").exists()
    return target


@pytest.fixture(scope="module")
def service(installed, qwen3_tokenizer, tmp_path_factory):
    logs = tmp_path_factory.mktemp("package_cluster")
    rules = rules_file([
        {"match": "alpha.txt", "scope": "prompt", "replies": bash_then_finish("wc -l < alpha.txt", "3")},
        {"match": "delta.txt", "scope": "prompt", "replies": bash_then_finish("cat delta.txt", "7")}])
    llm = start_llm_server(qwen3_tokenizer, logs, "package-llm", rules=rules)
    env = {"PYTHONPATH": os.pathsep.join([str(installed), str(ROOT)])}
    try:
        with LocalCluster(tokenizer=qwen3_tokenizer, env=env, gateway_workers=1, log_dir=logs,
                          concurrency={Stage.INIT: 1, Stage.RUN: 1, Stage.EVAL: 1}) as cluster:
            with httpx.Client(base_url=cluster.gateway_url, timeout=120) as client:
                client.post("/add_llm_server", json={"address": llm.address(), "type": "vllm"}).raise_for_status()
                yield client
    finally:
        llm.process.stop()


def test_the_package_is_not_importable_by_the_test_process_itself() -> None:
    # so the service below can only have found the task through the package's installation
    with pytest.raises(ImportError):
        __import__("prorl_wordcount")


def test_the_service_lists_and_runs_the_packaged_task(service) -> None:
    assert "wordcount" in service.get("/status").json()["tasks"]
    right = service.post("/process", json={"task": "wordcount",
                                           "instance": {"file": "alpha.txt", "lines": ["a", "b", "c"]}})
    assert right.status_code == 200, right.text
    result = right.json()
    assert result["status"] == "completed" and result["reward"] == 1.0, json.dumps(result)[:3000]
    observations = [m["content"] for m in result["trajectory"]["messages"] if m["role"] == "tool"]
    assert observations[0].strip() == "3"  # wc ran in the sandbox on the file INIT wrote
    wrong = service.post("/process", json={"task": "linecount", "instance": {"file": "delta.txt", "lines": ["d", "e"]}})
    assert wrong.json()["reward"] == 0.0 and wrong.json()["eval"] == {"answer": "7", "expected": 2}


def test_the_packaged_task_validates_its_instances(service) -> None:
    response = service.post("/process", json={"task": "wordcount", "instance": {"lines": "not a list"}})
    assert response.status_code == 400
    assert "'lines' must be a list" in response.json()["message"]
