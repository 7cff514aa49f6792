"""docs/trainer.md's programs, run as written against a live ``prorl up``: the client (submit,
wait, a group, cancel), the DAPO training loop, GRPO with TRL on the tiny model, verl's agent loop
(in the verl venv) and ``prorl submit``; every bash block of the page but the 25-minute run, in
page order, in one shell. The Python blocks are the example files themselves (tests/unit/test_docs.py)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from prorl_celery.dev.local import free_port
from tests.support.doc_blocks import code_blocks, page_script
from tests.support.processes import prorl_up, run_script

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "trainer.md"


def test_the_guide_runs_every_bash_block_but_the_long_run():
    skipped = [block.code.split("#")[0].strip() for block in code_blocks(PAGE, "bash") if not block.run]
    assert skipped == ["python examples/grpo_trl_cpu.py"]


@pytest.mark.extended
@pytest.mark.timeout(1500)
def test_trainer_guide_programs_run_against_prorl_up(tmp_path):
    port = free_port()
    with prorl_up(tmp_path / "state", port) as (_, env):
        script = page_script(PAGE, {":8080": f":{port}", "/tmp/math.results.jsonl": str(tmp_path / "math.jsonl"),
                                    "/tmp/prorl-trl-example": str(tmp_path / "trl")})
        returncode, output = run_script(script, ROOT, env, 1500)
    assert returncode == 0, output[-5000:]
    # the client: one job, a group of four valid rewards, a cancelled job with no reward
    assert re.search(r"^\w+: completed, reward 0\.0, \d+ prompt and \d+ response tokens$", output, re.M), output
    assert re.search(r"^group \w+: 4 valid rewards \[0\.0, 0\.0, 0\.0, 0\.0\]$", output, re.M)
    assert re.search(r"^\w+: cancelled, reward None$", output, re.M)
    # DAPO: two steps, each a batch of informative groups
    steps = re.findall(r"^step=(\d+) .*informative=(\d+)", output, re.M)
    assert [step for step, _ in steps] == ["1", "2"] and all(int(groups) > 0 for _, groups in steps), output
    # TRL: two optimizer steps of four rollouts each, none dropped
    assert re.findall(r"^step (\d): 4 rollouts in [\d.]+ s, 0 dropped$", output, re.M) == ["1", "2"], output
    # verl: one row through the agent loop, scored by the service
    assert re.search(r"^ProrlAgentLoop: \d+ prompt ids, \d+ response ids, \d+ of them the model's, "
                     r"reward_score 0\.0, \d+ turns$", output, re.M), output
    # prorl submit: 35 problems x 2 samples, all written
    assert len((tmp_path / "math.jsonl").read_text().splitlines()) == 70
