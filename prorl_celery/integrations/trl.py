"""TRL (>= 1.16) ``GRPOTrainer(rollout_func=...)`` through the rollout service.

Every prompt row the trainer hands over becomes one job: the service runs the whole multi-turn
rollout (tools in a sandbox, the LLM behind the gateway), evaluates it, and returns token ids,
per-token logprobs and the tool mask, which go to TRL unchanged (token-in/token-out: TRL never
re-tokenizes text). The reward comes back too: :func:`service_reward` is the reward function that
passes the service's EVAL through.

    from trl import GRPOConfig, GRPOTrainer
    from prorl_celery.integrations.trl import ProrlRollout, service_reward

    rollout = ProrlRollout("http://gateway:8080", rows=dataset, servers=["http://vllm:8000/v1"],
                           weights_dir="/shared/policy")
    trainer = GRPOTrainer(model=model, args=GRPOConfig(...), train_dataset=dataset,
                          reward_funcs=[service_reward], rollout_func=rollout)

The contract of TRL 1.16 (``trl/trainer/grpo_trainer.py``, ``_generate``): ``rollout_func(prompts,
trainer)`` gets the ``prompt`` column of the batch rows, already repeated ``num_generations``
times in a row by TRL's sampler, and returns one row per prompt received: ``prompt_ids``,
``completion_ids``, ``logprobs``, optionally ``env_mask`` (1 = model token; TRL trains only on
those), and any other keys, which reach the reward functions as keyword arguments.

Rows: a prompt can be a job instance itself (a dict or its JSON), or the ``prompt`` of a data set
row given as ``rows`` (any task family; verl-style rows with ``data_source``, ``prompt``,
``reward_model`` as they come): the row is then the job's instance.

Weights: before the rollouts of a new optimizer step, the trainer's model is saved
(``save_pretrained``, safetensors) under ``weights_dir`` and loaded into every vLLM server with
:class:`prorl_celery.weights.VLLMWeightSync` (pause in ``keep`` mode, reload, versions, resume):
the policy version is TRL's ``global_step``, so every rollout says which policy made it
(``policy_versions`` reaches the reward functions).
"""
from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..client import AsyncRolloutClient, LoopThread, new_job_id


def _key(prompt: Any) -> str:
    return json.dumps(prompt, sort_keys=True, ensure_ascii=False, default=str)


@dataclass
class StepTiming:
    step: int
    rollouts: int
    rollout_s: float
    weight_sync_s: float = 0.0
    policy_version: int = 0
    failed: int = 0


@dataclass
class ProrlRollout:
    """A TRL ``rollout_func``: ``trainer = GRPOTrainer(..., rollout_func=ProrlRollout(url, ...))``."""

    gateway_url: str | Sequence[str]
    #: data set rows (dicts, or a ``datasets.Dataset``) whose ``prompt`` TRL passes: each becomes
    #: the instance of the jobs run for that prompt
    rows: Iterable[Mapping[str, Any]] | None = None
    #: or a function from the prompt to the instance (wins over ``rows``)
    instance_for: Callable[[Any], dict[str, Any]] | None = None
    #: fields added to every instance (e.g. ``{"max_iterations": 3}``)
    instance_defaults: dict[str, Any] = field(default_factory=dict)
    #: sampler keys for every job; default: temperature / top_p / max_completion_length of the
    #: trainer's GRPOConfig (``max_tokens`` per turn)
    sampling_params: dict[str, Any] | None = None
    task: str | None = None
    timeout_s: float | None = None
    wait_timeout_s: float | None = 1800.0
    #: vLLM servers to push the trainer's weights to at every new step (none: no weight sync)
    servers: Sequence[str] = ()
    weights_dir: str | Path | None = None
    #: how many saved steps to keep under ``weights_dir``
    keep_weights: int = 2
    #: the step whose weights the servers hold when training starts (TRL's global_step 0: the
    #: servers were started on the initial model)
    initial_step: int = 0
    token: str | None = None
    timings: list[StepTiming] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list, repr=False)
    #: keep every result of the last call in ``results`` (for inspection)
    keep_results: bool = True

    def __post_init__(self) -> None:
        self._by_prompt: dict[str, dict[str, Any]] = {}
        for row in self.rows or ():
            row = dict(row)
            if "prompt" not in row:
                raise ValueError(f"a row given to ProrlRollout has no 'prompt' column: {sorted(row)}")
            self._by_prompt.setdefault(_key(row["prompt"]), row)
        self._synced_step = self.initial_step
        self._loop = LoopThread("prorl-trl")
        self._saved: list[Path] = []
        self._sync = None

    # -- TRL's side --------------------------------------------------------------------------

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        step = int(getattr(getattr(trainer, "state", None), "global_step", 0) or 0)
        sync_s = self.sync_weights(trainer, step) if self.servers else 0.0
        started = time.monotonic()
        results = self._loop.run(self._run(prompts, self._sampling_params(trainer)))
        timing = StepTiming(step, len(results), time.monotonic() - started, sync_s, self._synced_step,
                            sum(r.get("status") != "completed" for r in results))
        self.timings.append(timing)
        if self.keep_results:
            self.results = results
        return self.to_trl(results, eos_id=_eos_id(trainer))

    def instance(self, prompt: Any) -> dict[str, Any]:
        """The job instance for one prompt TRL passed."""
        key = _key(prompt)
        if self.instance_for is not None:
            instance = self.instance_for(prompt)
        elif key in self._by_prompt:
            instance = dict(self._by_prompt[key])
        elif isinstance(prompt, Mapping):
            instance = dict(prompt)
        elif isinstance(prompt, str) and prompt.lstrip().startswith("{"):
            instance = json.loads(prompt)
        else:
            raise KeyError("ProrlRollout: a prompt matches no row given as rows= (and instance_for= is not set): "
                           f"{key[:200]}")
        return {**self.instance_defaults, **instance}

    def _sampling_params(self, trainer: Any) -> dict[str, Any]:
        if self.sampling_params is not None:
            return dict(self.sampling_params)
        args = getattr(trainer, "args", None)
        params: dict[str, Any] = {"temperature": float(getattr(args, "temperature", 1.0) or 1.0)}
        if getattr(args, "top_p", None) not in (None, 1.0):
            params["top_p"] = float(args.top_p)
        if getattr(args, "max_completion_length", None):
            params["max_tokens"] = int(args.max_completion_length)
        return params

    async def _run(self, prompts: list[Any], sampling_params: dict[str, Any]) -> list[dict[str, Any]]:
        # TRL repeats each prompt num_generations times in a row: one group per run of equal
        # prompts (one POST /jobs with num_samples), all groups submitted at once
        groups: list[tuple[dict[str, Any], int]] = []
        last = object()
        for prompt in prompts:
            key = _key(prompt)
            if groups and key == last:
                groups[-1] = (groups[-1][0], groups[-1][1] + 1)
            else:
                groups.append((self.instance(prompt), 1))
            last = key
        async with AsyncRolloutClient(self.gateway_url, token=self.token) as client:
            id_lists = await asyncio.gather(*(
                client.submit_group(instance, n, sampling_params=sampling_params, group_id=new_job_id("trl-"),
                                    task=self.task, timeout_s=self.timeout_s)
                for instance, n in groups))
            ids = [job_id for group in id_lists for job_id in group]
            return await client.wait_all(ids, self.wait_timeout_s)

    @staticmethod
    def to_trl(results: list[dict[str, Any]], eos_id: int = 0) -> dict[str, list]:
        """TRL's rollout_func output from the service's results (one row each, in order).

        A job that ended without a trajectory gives a one-token completion masked out
        (``env_mask`` 0) and reward None (TRL leaves a row every reward function scored None out
        of the group's baseline)."""
        out: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask",
                                                "service_reward", "policy_versions", "job_id", "status",
                                                "num_turns")}
        for result in results:
            trajectory = result.get("trajectory") or {}
            response = list(trajectory.get("response_ids") or [])
            ok = result.get("status") == "completed" and bool(response)
            out["prompt_ids"].append(list(trajectory.get("prompt_ids") or [eos_id]))
            out["completion_ids"].append(response if ok else [eos_id])
            out["logprobs"].append([float(x) for x in trajectory["response_logprobs"]] if ok else [0.0])
            out["env_mask"].append([int(m) for m in trajectory["response_mask"]] if ok else [0])
            reward = result.get("reward", result.get("score"))
            out["service_reward"].append(float(reward) if ok and reward is not None else None)
            out["policy_versions"].append(trajectory.get("policy_versions"))
            out["job_id"].append(result.get("job_id"))
            out["status"].append(result.get("status"))
            out["num_turns"].append(len(trajectory.get("turns") or ()))
        return out

    # -- weights -------------------------------------------------------------------------------

    def sync_weights(self, trainer: Any, step: int) -> float:
        """Push the trainer's weights to ``servers`` as policy version ``step``, when the servers
        hold an older step; seconds it took (0 when nothing was needed)."""
        if step == self._synced_step:
            return 0.0
        if self.weights_dir is None:
            raise ValueError("ProrlRollout: servers= needs weights_dir= (a directory the vLLM servers can read)")
        from ..weights import VLLMWeightSync

        started = time.monotonic()
        model = trainer.accelerator.unwrap_model(trainer.model) if hasattr(trainer, "accelerator") else trainer.model
        target = Path(self.weights_dir) / f"step-{step}"
        if target.exists():
            shutil.rmtree(target)
        model.save_pretrained(target, safe_serialization=True)
        if self._sync is None:
            self._sync = VLLMWeightSync(self.gateway_url if isinstance(self.gateway_url, str) else self.gateway_url[0],
                                        token=self.token)
        self._sync.update(list(self.servers), str(target), version=step)
        self._synced_step = step
        self._saved.append(target)
        while len(self._saved) > self.keep_weights:
            shutil.rmtree(self._saved.pop(0), ignore_errors=True)
        return time.monotonic() - started

    def close(self) -> None:
        if self._sync is not None:
            self._sync.close()
        self._loop.close()


def service_reward(completions: list[Any] | None = None, service_reward: list[float | None] | None = None,
                   **_: Any) -> list[float | None]:
    """TRL reward function: the reward the service's EVAL gave each rollout (None for a failed
    job, which TRL leaves out of the group baseline)."""
    return list(service_reward or [None] * len(completions or ()))


def _eos_id(trainer: Any) -> int:
    processing = getattr(trainer, "processing_class", None)
    tokenizer = getattr(processing, "tokenizer", processing)
    value = getattr(tokenizer, "eos_token_id", None)
    return int(value) if value is not None else 0
