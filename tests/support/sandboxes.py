"""Sandbox runtimes with injected faults, for the teardown tests."""
from __future__ import annotations

from singularity.runtime import procfs
from singularity.runtime.bubblewrap import BubblewrapRuntime


class FirstStopFails(BubblewrapRuntime):
    """Bubblewrap whose first stop sends no signal and reports every member as still running
    (as when they hang in uninterruptible I/O); every later stop is the real one."""

    failed_stops = 0

    def _terminate(self, root, pidns, refs, grace_s, popen):
        if not self.failed_stops:
            self.failed_stops += 1
            return procfs.members(root, pidns, refs)
        return super()._terminate(root, pidns, refs, grace_s, popen)
