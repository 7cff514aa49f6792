"""Fork group ids: the one rule the gateway and the trainer SDK share (``docs/journal.md``).

``POST /jobs/<id>/fork`` makes jobs ``<group_id>-<i>`` for i in 0..count-1. A client that gives
its own ``group_id`` makes the request idempotent: a second identical request finds the same
jobs and starts none. So every fork's id must be a valid job id (``[A-Za-z0-9_.:-]{1,128}``,
what ``GET /jobs/<id>`` and ``POST /jobs/wait`` accept): a group id leaves room for ``-<i>``.
"""
from __future__ import annotations

import re
import uuid

#: the longest job id the gateway accepts (``api.schemas.JOB_ID_PATTERN``)
JOB_ID_MAX = 128
#: most forks one request may start
MAX_FORKS = 64
#: the longest group id: ``<group_id>-<MAX_FORKS - 1>`` is still a valid job id
GROUP_ID_MAX = JOB_ID_MAX - len(f"-{MAX_FORKS - 1}")
GROUP_ID = re.compile(rf"^[A-Za-z0-9_.:\-]{{1,{GROUP_ID_MAX}}}$")


def is_group_id(value: str) -> bool:
    return bool(GROUP_ID.match(value))


def fork_job_id(group_id: str, index: int) -> str:
    """The id of fork ``index`` of a group."""
    return f"{group_id}-{index}"


def new_group_id(job_id: str, turn: int) -> str:
    """A fresh group id for forks of ``job_id`` at ``turn``: ``<job>-fork<k>-<tag>``, or, when a
    long job id leaves no room for that, ``fork<k>-<32 hex>`` (the forks' ``fork.of`` names the
    source either way)."""
    tag = uuid.uuid4().hex
    group = f"{job_id}-fork{turn}-{tag[:6]}"
    return group if is_group_id(group) else f"fork{turn}-{tag}"
