"""verl (0.9.1) agent loop that runs every rollout through the rollout service.

    # in the training script (or a module named in the trainer's imports)
    import prorl_celery.trainer.integrations.verl  # registers the agent loop "prorl"
    # data rows: agent_name = "prorl" (or actor_rollout_ref.rollout.agent.default_agent_loop=prorl)

``ProrlAgentLoop.run(sampling_params, **row)`` posts the row to the gateway as one job (verl's row
as it comes: ``data_source``, ``raw_prompt``/``prompt``, ``reward_model``, ``extra_info``; a row's
``extra_info["prorl_instance"]``, when present, is the instance itself, for task families whose
instances are not verl-shaped), waits for the result, and returns verl's ``AgentLoopOutput`` with
the service's token ids, mask (1 = model token), logprobs and reward (``reward_score``: verl then
skips its own reward function), and ``num_turns``. The gateway URL: ``$PRORL_GATEWAY_URL``, or the
trainer config's ``prorl.gateway_url``. verl's own LLM servers are not used: the service calls
the vLLM servers registered with it (``/add_llm_server``); push weights to them with
:class:`prorl_celery.trainer.weights.VLLMWeightSync` after each step.

Rewards that are not valid (DESIGN decision 16): a job whose result says its reward does not
measure the policy (outcome ``env_error``, ``backend_error``, ``eval_error``, ``timeout`` or
``cancelled``; :func:`prorl_celery.trainer.client.reward_of`) is never returned as a reward. verl cannot
drop a sample: every row of its batch must come back as one ``AgentLoopOutput``, its GRPO groups
have a fixed size, and a ``reward_score`` of None makes verl score the output with its own reward
function. So the loop resubmits the rollout (same instance and sampling, a new job id) up to
``max_resubmits`` times (``$PRORL_MAX_RESUBMITS``, or the trainer config's
``prorl.max_resubmits``; default 2), and when its reward is still not valid it raises
:class:`prorl_celery.trainer.client.RewardInvalid` naming the outcome and its detail, which stops the step
loudly instead of training on 0.

Several samples per rollout (sub-agents, rewrites; DESIGN decision 19): verl 0.9.1 takes one
``AgentLoopOutput`` per row, so the row is the main agent's sample (the trajectory's top level)
and every training sample of the rollout, the main one first, rides in
``extra_fields["prorl_samples"]`` (origin, ids, mask, logprobs, reward, policy versions), which
verl hands the trainer in its batch's ``non_tensor_batch``. Auxiliary samples (another model
name, e.g. a small model's titles) are in it only with ``$PRORL_TRAIN_AUXILIARY`` (or
``prorl.train_auxiliary``) set.

verl pins ``transformers<5.11``: it lives in a venv of its own (``scripts/install_verl.sh``); the
service never imports this module.
"""
from __future__ import annotations

import os
import time
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from prorl_celery.trainer.client import AsyncRolloutClient, JobRequest, RewardInvalid, RolloutOutcome, reward_of
from prorl_celery.trainer.samples import Sample, samples_of

#: verl sampling keys the service's vLLM backends accept, under the same name
SAMPLER_KEYS = ("temperature", "top_p", "top_k", "repetition_penalty", "seed")
#: verl row keys that are bookkeeping, never part of the instance
ROW_BOOKKEEPING = ("agent_name", "index", "tools_kwargs", "interaction_kwargs", "raw_prompt_ids", "uid",
                   "multi_modal_data", "__num_turns__", "priority")
#: resubmissions of a rollout whose reward is not valid, unless configured
MAX_RESUBMITS = 2


def sample_fields(sample: Sample) -> dict[str, Any]:
    """A training sample as plain data (verl carries ``extra_fields`` as objects to the trainer)."""
    return {"origin": sample.origin, "index": sample.index, "model": sample.model, "parent": sample.parent,
            "primary": sample.primary, "prompt_ids": sample.prompt_ids, "response_ids": sample.response_ids,
            "response_mask": sample.response_mask, "response_logprobs": sample.response_logprobs,
            "reward": sample.reward, "policy_versions": sample.policy_versions}


def instance_of(row: dict[str, Any]) -> dict[str, Any]:
    """The job instance for one verl row."""
    extra = row.get("extra_info") or {}
    if isinstance(extra, dict) and isinstance(extra.get("prorl_instance"), dict):
        return dict(extra["prorl_instance"])
    instance = {k: _plain(v) for k, v in row.items() if k not in ROW_BOOKKEEPING and k != "raw_prompt"}
    if "raw_prompt" in row:
        instance["prompt"] = _plain(row["raw_prompt"])
    return instance


def sampler_params(sampling_params: dict[str, Any], response_length: int | None) -> dict[str, Any]:
    params = {k: sampling_params[k] for k in SAMPLER_KEYS if sampling_params.get(k) is not None}
    if params.get("top_k") in (-1, 0):
        params.pop("top_k")
    if response_length:
        params["max_tokens"] = int(response_length)
    return params


def _plain(value: Any) -> Any:
    """numpy arrays/scalars (verl's non-tensor batch) to JSON-able Python values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@register("prorl")
class ProrlAgentLoop(AgentLoopBase):
    """One rollout = one job of the rollout service (resubmitted while its reward is not valid,
    up to ``max_resubmits``; then RewardInvalid: see the module docstring)."""

    #: replaces the network (an ``httpx.AsyncBaseTransport``; tests)
    transport: Any = None

    def _setting(self, name: str, environment: str) -> Any:
        """``$<environment>``, else the trainer config's ``prorl.<name>``, else None."""
        value = os.environ.get(environment)
        if not value:
            try:
                value = (self.config.get("prorl") or {}).get(name)
            except AttributeError:
                value = None
        return value

    def _gateway(self) -> str:
        url = self._setting("gateway_url", "PRORL_GATEWAY_URL")
        if not url:
            raise RuntimeError("ProrlAgentLoop needs the gateway URL: set PRORL_GATEWAY_URL or prorl.gateway_url")
        return str(url)

    def _train_auxiliary(self) -> bool:
        value = self._setting("train_auxiliary", "PRORL_TRAIN_AUXILIARY")
        return str(value).lower() in ("1", "true", "yes") if value is not None else False

    def _max_resubmits(self) -> int:
        value = self._setting("max_resubmits", "PRORL_MAX_RESUBMITS")
        return MAX_RESUBMITS if value is None else int(value)

    async def run(self, sampling_params: dict[str, Any], **row: Any) -> AgentLoopOutput:
        response_length = None
        try:
            response_length = int(self.rollout_config.response_length)
        except (AttributeError, TypeError, ValueError):
            pass
        started = time.monotonic()
        request = JobRequest(instance_of(row), sampler_params(sampling_params, response_length))
        async with AsyncRolloutClient(self._gateway(), token=os.environ.get("PRORL_API_TOKEN"),
                                      transport=self.transport) as client:
            (attempts,) = await client.run_until_valid([request], max_resubmits=self._max_resubmits())
        elapsed = time.monotonic() - started
        result, job_id = attempts[-1], attempts[-1].get("job_id")
        reward = reward_of(result)
        if reward is None:  # verl cannot leave a sample out: stop the step, never score it 0
            ending = RolloutOutcome.of(result)
            raise RewardInvalid(f"ProrlAgentLoop: no valid reward after {len(attempts) - 1} resubmissions "
                                f"(max_resubmits); {ending.describe()}", ending)
        trajectory = result.get("trajectory") or {}
        ok = bool(trajectory.get("response_ids"))
        prompt_ids = list(trajectory.get("prompt_ids") or [])
        response_ids = list(trajectory.get("response_ids") or [])
        mask = [int(m) for m in trajectory.get("response_mask") or []]
        logprobs = [float(x) for x in trajectory.get("response_logprobs") or []]
        if response_length is not None:  # verl pads responses to response_length and refuses longer ones
            response_ids, mask, logprobs = (response_ids[:response_length], mask[:response_length],
                                            logprobs[:response_length])
        if not ok:  # a valid reward without tokens (the agent wrote nothing): one masked-out token
            pad = self.tokenizer.eos_token_id if self.tokenizer is not None else 0
            response_ids, mask, logprobs = [pad], [0], [0.0]
        turns = trajectory.get("turns") or []
        timing = result.get("timing") or {}
        return AgentLoopOutput(
            prompt_ids=prompt_ids, response_ids=response_ids, response_mask=mask, response_logprobs=logprobs,
            reward_score=reward,
            # every message of the conversation (system/user, assistant, tool), as verl counts them
            num_turns=len(result.get("messages") or []) or 1 + 2 * len(turns),
            metrics=AgentLoopMetrics(generate_sequences=float(timing.get("run_s") or elapsed),
                                     compute_score=float(timing.get("eval_s") or 0.0)),
            extra_fields={"prorl_job_id": job_id, "prorl_status": result.get("status"),
                          "prorl_outcome": RolloutOutcome.of(result).outcome, "prorl_resubmits": len(attempts) - 1,
                          "prorl_policy_versions": trajectory.get("policy_versions"),
                          "prorl_truncated": len(trajectory.get("response_ids") or []) > len(response_ids),
                          "prorl_samples": [sample_fields(s) for s in
                                            samples_of(result, include_auxiliary=self._train_auxiliary())]},
        )
