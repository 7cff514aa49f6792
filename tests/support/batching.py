"""A FaultHandler whose stages may share messages (``batched_stages``): the chunk tests load it
into real workers with ``PRORL_HANDLERS=bfault=tests.support.batching:BatchedFaultHandler``."""
from __future__ import annotations

from typing import ClassVar

from prorl_celery.core.status import Stage
from tests.support.handlers import FaultHandler


class BatchedFaultHandler(FaultHandler):
    name = "bfault"
    batched_stages: ClassVar[frozenset[Stage]] = frozenset(Stage)
