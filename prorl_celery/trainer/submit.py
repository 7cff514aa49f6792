"""``prorl submit``: post a data set to a running service and collect its results.

Rows are JSONL objects or Parquet rows (pyarrow, when installed) in any format the task's
handler accepts. Each row becomes one job whose id is derived from the run id, row and sample
index, so re-running an interrupted submit with the same ``--run-id`` resumes instead of
duplicating work.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

from prorl_celery.trainer.client import JobRequest, RolloutClient, RolloutOutcome, reward_of


def read_rows(path: Path) -> Iterator[dict[str, Any]]:
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as parquet
        except ImportError:
            raise SystemExit("reading Parquet needs pyarrow: pip install pyarrow") from None
        yield from parquet.read_table(path).to_pylist()
        return
    with path.open() as lines:
        for number, line in enumerate(lines, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as error:
                    raise SystemExit(f"{path}:{number}: not a JSON object ({error.msg})") from None


def job_requests(path: Path, task: str, samples: int, sampling: dict[str, Any],
                 timeout_s: float | None, run_id: str) -> list[JobRequest]:
    digest = hashlib.sha1(f"{run_id}:{path.resolve()}".encode()).hexdigest()[:12]
    requests = []
    for row_index, row in enumerate(read_rows(path)):
        for sample in range(samples):
            requests.append(JobRequest(instance=row, sampling_params=sampling, task=task, timeout_s=timeout_s,
                                       job_id=f"submit-{digest}-{row_index}-{sample}"))
    return requests


def submit_file(client: RolloutClient, requests: list[JobRequest], out: Path) -> list[dict[str, Any]]:
    """Submit every job, write each ended job's record to ``out`` as one JSONL line as it ends,
    return them.

    Every job that ended has its line, a failed one too (its ``status``, ``outcome`` and
    ``error``); a job that did not end (the command was interrupted or refused) has none. ``out``
    is opened at the first ended job, so a submit that ends before any leaves no empty file, and
    the file of an earlier run of that path as it was (issue 37: a refused submit left an empty
    results file, which read as "every job gave nothing").
    """
    ids = client.submit_many(requests)
    results, invalid = [], 0
    with contextlib.ExitStack() as files, tqdm(total=len(ids), desc="rollouts", unit="job") as progress:
        sink: TextIO | None = None
        for result in client.as_completed(ids):
            if sink is None:
                sink = files.enter_context(out.open("w"))
            results.append(result)
            invalid += reward_of(result) is None
            sink.write(json.dumps(result) + "\n")
            progress.update(1)
            progress.set_postfix(no_reward=invalid, in_flight=len(ids) - len(results))
    return results


def summary(results: list[dict[str, Any]]) -> str:
    if not results:
        return "no rows"
    mean = lambda values: statistics.fmean(values) if values else 0.0  # noqa: E731
    trajectories = [r.get("trajectory") or {} for r in results]
    statuses: dict[str, int] = {}
    outcomes: dict[str, int] = {}
    for result in results:
        statuses[result["status"]] = statuses.get(result["status"], 0) + 1
        outcome = RolloutOutcome.of(result).outcome or result["status"]
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    rewards = [reward for reward in map(reward_of, results) if reward is not None]
    lines = [
        f"jobs        {len(results)}  ({', '.join(f'{k} {v}' for k, v in sorted(statuses.items()))})",
        f"outcomes    {', '.join(f'{k} {v}' for k, v in sorted(outcomes.items()))}",
        f"reward      mean {mean(rewards):.3f} over the {len(rewards)} valid",
        f"turns       mean {mean([t.get('num_turns', 0) for t in trajectories]):.2f}",
        f"tokens      mean {mean([len(t.get('response_mask', [])) for t in trajectories]):.1f} response, "
        f"{mean([sum(t.get('response_mask', [])) for t in trajectories]):.1f} generated",
    ]
    stages = ("queued_s", "init_s", "run_s", "eval_s")
    lines.append("time (mean) " + ", ".join(f"{s[:-2]} {mean([r['timing'][s] for r in results]):.2f} s"
                                             for s in stages))
    return "\n".join(lines)
