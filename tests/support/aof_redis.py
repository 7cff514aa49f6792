"""A redis-server that a fault test can kill and restart on the same port without losing a write.

Persistence is an append-only file fsynced after every write (``appendfsync always``), so a
restart (SIGKILL, or a clean stop) brings back every job, queue and ledger entry as it was:
what a test of "Redis restarted mid-stage" needs, which the session's throwaway Redis
(``--appendonly no``) cannot give.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import redis

from prorl_celery.dev.local import ManagedProcess, free_port, wait_until


class AofRedis:
    """A redis-server persisting every write (AOF, fsync always) that a test can kill and restart."""

    def __init__(self, directory: Path) -> None:
        self.directory, self.port = directory, free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        self.process: ManagedProcess | None = None

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        log = self.directory / "redis.log"
        binary = shutil.which("redis-server")
        assert binary, "redis-server is required (apt-get install redis-server)"
        with open(log, "ab") as out:
            popen = subprocess.Popen([binary, "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--dir", str(self.directory), "--appendonly", "yes",
                                      "--appendfsync", "always", "--save", "", "--maxclients", "10000"],
                                     stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.process = ManagedProcess("aof-redis", popen, log)
        wait_until(lambda: redis.Redis.from_url(self.url).ping(), 20, "redis-server", self.process)

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.popen.pid, signal.SIGKILL)
        self.process.popen.wait(10)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
