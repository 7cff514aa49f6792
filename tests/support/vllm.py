"""Real vLLM (CPU) servers for tests/integration/test_vllm_real.py.

The vLLM venv comes from ``scripts/install_vllm.sh`` (``$PRORL_VLLM_PYTHON``, else the default
venv paths of :mod:`prorl_celery.dev.vllmcpu`). Without it the tests skip, saying why, except when
``CI`` or ``PRORL_REQUIRE_VLLM`` is set (``.ci/run`` sets the latter): then they fail, so CI never
goes green by skipping them.
"""
from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from prorl_celery.dev.local import ManagedProcess, free_port, wait_until
from prorl_celery.dev.vllmcpu import check_vllm_python, find_vllm_python, vllm_command, vllm_env


def vllm_required() -> bool:
    return any(os.environ.get(name, "").lower() not in ("", "0", "false", "no")
               for name in ("CI", "PRORL_REQUIRE_VLLM"))


def skip_unless_vllm() -> pytest.MarkDecorator:
    """A module's ``pytestmark``: skip at once (no cluster started) when no vLLM venv exists
    and none is required; when one is required, :func:`require_vllm_python` fails the tests."""
    python, why = find_vllm_python()
    return pytest.mark.skipif(python is None and not vllm_required(), reason=why)


def require_vllm_python() -> str:
    """The vLLM venv's python; skip (locally) or fail (CI) without a working one."""
    python, why = find_vllm_python()
    problem = None
    if python is None:
        problem = why
    elif check_vllm_python(python) is None:
        problem = f"{python} ({why}) cannot import vllm: rerun scripts/install_vllm.sh"
    if problem is not None:
        if vllm_required():
            pytest.fail(f"real-vLLM tests must run here (CI/PRORL_REQUIRE_VLLM set): {problem}", pytrace=False)
        pytest.skip(problem)
    return python


class VLLMServer:
    """One ``vllm.entrypoints.openai.api_server`` process on a loopback port."""

    def __init__(self, python: str, model: Path, log_dir: Path, name: str, *, max_model_len: int,
                 cpus: str | None = None) -> None:
        self.name, self.model, self.max_model_len = name, str(model), max_model_len
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.address = self.base + "/v1"
        self.log_path = log_dir / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env.update(vllm_env(kv_cache_gib=1, cpus=cpus, dev_mode=True))
        self.started = time.monotonic()
        with open(self.log_path, "wb") as log:
            popen = subprocess.Popen(vllm_command(python, model, self.port, max_model_len, cpus=cpus), stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                     start_new_session=True)
        self.process = ManagedProcess(name, popen, self.log_path)
        self.ready_s: float | None = None
        self.warm_up_s: float | None = None

    def wait_ready(self, timeout_s: float = 300) -> VLLMServer:
        """Until ``/v1/models`` answers, then one short completion (vLLM's first request is
        several seconds slower than the next ones); records both times."""
        wait_until(lambda: httpx.get(self.base + "/v1/models", timeout=5).status_code == 200, timeout_s,
                   f"vLLM server {self.name}", self.process)
        self.ready_s = time.monotonic() - self.started
        started = time.monotonic()
        self.complete([151644, 872, 198], max_tokens=4)
        self.warm_up_s = time.monotonic() - started
        return self

    def complete(self, prompt_ids: list[int], **params) -> httpx.Response:
        body = {"model": self.model, "prompt": prompt_ids, "logprobs": 0, "return_token_ids": True, **params}
        return httpx.post(self.base + "/v1/completions", json=body, timeout=120)

    def metrics(self) -> dict[str, float]:
        """vLLM's Prometheus gauges and counters, summed over their labels except
        ``finished_reason`` (``request_success_total:abort``, ...)."""
        values: dict[str, float] = {}
        for line in httpx.get(self.base + "/metrics", timeout=5).text.splitlines():
            match = re.match(r"^vllm:(\w+)(\{[^}]*\})? (\S+)$", line)
            if not match:
                continue
            name, labels, value = match.groups()
            reason = re.search(r'finished_reason="(\w+)"', labels or "")
            key = f"{name}:{reason.group(1)}" if reason else name
            values[key] = values.get(key, 0.0) + float(value)
        return values

    def running(self) -> float:
        """The ``vllm:num_requests_running`` gauge. vLLM updates it on engine steps only, so an
        idle server may still show the last busy step's value: wait on :meth:`generated` to
        know a request is really running."""
        return self.metrics()["num_requests_running"]

    def generated(self) -> float:
        """``vllm:generation_tokens_total``: tokens generated so far (a counter, never stale)."""
        return self.metrics()["generation_tokens_total"]

    def finished(self) -> float:
        """Requests vLLM finished for any reason (stop, length, abort, ...)."""
        return sum(v for k, v in self.metrics().items() if k.startswith("request_success_total:"))

    def first_tokens(self) -> float:
        """Requests that produced their first token (the TTFT histogram's count). Like
        :meth:`generated` it is a counter, so unlike the running gauge it never shows a stale
        value: on a loaded machine the gauge was seen to lag the tokens by seconds."""
        return self.metrics()["time_to_first_token_seconds_count"]

    def generating(self, window_s: float = 0.3) -> bool:
        """Whether tokens are being generated: the counter moves within ``window_s``."""
        before = self.generated()
        time.sleep(window_s)
        return self.generated() > before

    def wait_idle(self, timeout_s: float = 60) -> None:
        """Until no request runs: the gauge says 0 and no token is generated for a while (an
        earlier test's request still finishing would move the counters a test reads)."""
        wait_until(lambda: self.running() == 0 and not self.generating(0.5), timeout_s,
                   f"{self.name} idle")

    def stop(self) -> None:
        self.process.stop(grace_s=15)


#: where scripts/install_verl.sh puts verl's venv
VERL_VENVS = (Path("/opt/verl-venv"), Path.home() / ".cache" / "prorl-celery" / "verl-venv")


def require_verl_python() -> str:
    """verl's venv python (``$PRORL_VERL_PYTHON``, else scripts/install_verl.sh's default venvs);
    skip (locally) or fail (CI / PRORL_REQUIRE_VLLM) when there is none that imports verl."""
    configured = os.environ.get("PRORL_VERL_PYTHON")
    candidates = [Path(configured)] if configured else [v / "bin" / "python" for v in VERL_VENVS]
    python = next((str(p) for p in candidates if p.is_file()), None)
    problem = None
    if python is None:
        problem = f"verl is not installed: run scripts/install_verl.sh (looked for {', '.join(map(str, candidates))})"
    else:
        done = subprocess.run([python, "-c", "from verl.experimental.agent_loop import AgentLoopBase"],
                              capture_output=True, text=True, timeout=180)
        if done.returncode != 0:
            problem = f"{python} cannot import verl: rerun scripts/install_verl.sh ({done.stderr.strip()[-300:]})"
    if problem is not None:
        if vllm_required():
            pytest.fail(f"the verl test must run here (CI/PRORL_REQUIRE_VLLM set): {problem}", pytrace=False)
        pytest.skip(problem)
    return python
