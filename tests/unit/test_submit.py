"""``prorl submit``'s results file (issue 37: a refused submit left an empty one behind)."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prorl_celery.core.errors import UnknownTask
from prorl_celery.trainer.client import JobRequest
from prorl_celery.trainer.submit import submit_file

REQUESTS = [JobRequest(instance={"problem": "2 + 3?", "answer": "5"}, task="math", job_id=f"j{i}") for i in range(3)]
FAILED = {"job_id": "j1", "status": "failed", "outcome": "env_error", "reward": None,
          "error": {"code": "sandbox_failed", "message": "the sandbox did not start"}}


class Client:
    """What ``submit_file`` calls of a RolloutClient: the jobs it refuses, then those that end."""

    def __init__(self, ended: list[dict[str, Any]], refuse: Exception | None = None,
                 then: BaseException | None = None) -> None:
        self.ended, self.refuse, self.then = ended, refuse, then

    def submit_many(self, requests: list[JobRequest]) -> list[str]:
        if self.refuse is not None:
            raise self.refuse
        return [request.job_id for request in requests]

    def as_completed(self, job_ids: list[str]) -> Iterator[dict[str, Any]]:
        yield from self.ended
        if self.then is not None:
            raise self.then


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_refused_submit_writes_no_file_and_keeps_an_earlier_one(tmp_path):
    out = tmp_path / "rows.results.jsonl"
    with pytest.raises(UnknownTask):
        submit_file(Client([], refuse=UnknownTask("no task 'nosuch'")), REQUESTS, out)
    assert not out.exists()
    out.write_text(json.dumps(FAILED) + "\n")  # an earlier run's
    with pytest.raises(UnknownTask):
        submit_file(Client([], refuse=UnknownTask("no task 'nosuch'")), REQUESTS, out)
    assert lines(out) == [FAILED]


def test_every_ended_job_has_its_line_a_failed_one_with_its_error(tmp_path):
    out = tmp_path / "rows.results.jsonl"
    done = {"job_id": "j0", "status": "completed", "outcome": "ok", "reward": 1.0}
    # interrupted with the third job still running: it has no line, the two that ended have theirs
    with pytest.raises(KeyboardInterrupt):
        submit_file(Client([done, FAILED], then=KeyboardInterrupt()), REQUESTS, out)
    assert lines(out) == [done, FAILED]
    assert lines(out)[1]["error"]["message"] == "the sandbox did not start"


def test_an_interrupted_submit_that_ended_no_job_writes_no_file(tmp_path):
    out = tmp_path / "rows.results.jsonl"
    with pytest.raises(KeyboardInterrupt):
        submit_file(Client([], then=KeyboardInterrupt()), REQUESTS, out)
    assert not out.exists()
