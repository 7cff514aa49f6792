"""docs/testing.md documents every rule key of the scripted LLM server and its ``/_log`` route,
with the example program a test runs (issue 37: neither was written down)."""
from __future__ import annotations

import re
from pathlib import Path

from prorl_celery.dev.llm_server.engines import Rule
from tests.support.doc_blocks import shown_files

ROOT = Path(__file__).resolve().parents[2]
TESTING = ROOT / "docs" / "testing.md"
#: a row of the rules table: its first cell is one key
KEY_ROW = re.compile(r"^\| `(\w+)` \|", re.M)


def section() -> str:
    return TESTING.read_text().split("## A test of your own: the scripted LLM server", 1)[1]


def test_the_rules_table_names_every_key_of_a_rule():
    assert sorted(KEY_ROW.findall(section())) == sorted(Rule.model_fields)


def test_the_log_route_and_its_fields_are_documented():
    from prorl_celery.dev.llm_server.engines import SamplingParams
    from prorl_celery.dev.llm_server.protocols import Generation
    record = Generation(request_id="r", protocol="vllm", prompt_ids=[1], params=SamplingParams(max_tokens=1),
                        started=0.0).log_record()
    text = section()
    assert "**`GET /_log`**" in text and "`POST /_reset`" in text
    assert [key for key in record if f'"{key}"' not in text] == []


def test_the_page_shows_the_example_the_integration_test_runs():
    shown = {name for kind, name, _ in shown_files(TESTING) if kind == "example"}
    assert "examples/testing/scripted_server.py" in shown
    assert (ROOT / "tests" / "integration" / "test_testing_guide.py").read_text().count("scripted_server.py") == 1
