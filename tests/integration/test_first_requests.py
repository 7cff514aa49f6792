"""docs/first-requests.md, run as written: every bash block in page order (but ``prorl up``, which
the test starts itself) in one shell against a live ``prorl up``, with curl failing on an HTTP
error; then what the page says each command shows is checked, so that the page cannot rot."""
from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from prorl_celery.dev.local import free_port
from tests.support.doc_blocks import code_blocks, page_script
from tests.support.processes import prorl_up, run_script

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "first-requests.md"
FAMILIES = ("first-math-tool", "first-code", "first-stem", "first-swe", "first-agent")


def test_the_page_runs_all_but_prorl_up():
    """The one block the test does not run is ``prorl up``, which it starts on a free port."""
    skipped = [block.code.split()[:2] for block in code_blocks(PAGE) if not block.run]
    assert skipped == [["prorl", "up"]]
    assert all(block.language == "bash" for block in code_blocks(PAGE))


@pytest.mark.extended
@pytest.mark.timeout(900)
def test_first_requests_page_runs_against_prorl_up(tmp_path):
    gateway_port, llm_port = free_port(), free_port()
    with prorl_up(tmp_path / "state", gateway_port) as (gateway, env):
        # the page's addresses are 127.0.0.1:8080 (the gateway) and :8001 (the LLM it starts)
        script = page_script(PAGE, {":8080": f":{gateway_port}", "--port 8001": f"--port {llm_port}",
                                    ":8001/": f":{llm_port}/"})
        returncode, output = run_script(script, ROOT, env, 900)
        assert returncode == 0, output[-4000:]

        # what the page says each part shows
        assert '"status": "running"' in output
        group = re.findall(r"^first-group-\d (\w+) (\w+) (\S+)$", output, re.M)
        assert len(group) == 4 and all(status == "completed" for status, _, _ in group), output
        ended = {job_id: (status, outcome, reward)
                 for job_id, status, outcome, reward in re.findall(r"^(first-[\w-]+) (\w+) (\w+) (\S+)$", output, re.M)}
        for job_id in FAMILIES:
            assert ended[job_id][:2] == ("completed", "ok"), (job_id, ended[job_id], output[-3000:])
        assert ended["first-agent"][2] == "1.0"
        cancelled = httpx.get(f"{gateway}/jobs/first-cancel").json()
        assert (cancelled["status"], cancelled["outcome"], cancelled["reward"]) == ("cancelled", "cancelled", None)
        assert f'"address": "http://127.0.0.1:{llm_port}/v1"' in output  # registered, then listed
        servers = [server["address"] for server in httpx.get(f"{gateway}/llm_servers").json()["servers"]]
        assert f"http://127.0.0.1:{llm_port}/v1" not in servers and len(servers) == 1  # removed by address
