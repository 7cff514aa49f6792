"""TRL (>= 1.16) ``GRPOTrainer(rollout_func=...)`` through the rollout service.

Every prompt row the trainer hands over becomes one job: the service runs the whole multi-turn
rollout (tools in a sandbox, the LLM behind the gateway), evaluates it, and returns token ids,
per-token logprobs and the tool mask, which go to TRL unchanged (token-in/token-out: TRL never
re-tokenizes text). The reward comes back too: :func:`service_reward` is the reward function that
passes the service's EVAL through.

    from trl import GRPOConfig, GRPOTrainer
    from prorl_celery.trainer.integrations.trl import ProrlRollout, service_reward

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

Rewards that are not valid (DESIGN decision 16): a job whose result says its reward does not
measure the policy (outcome ``env_error``, ``backend_error``, ``eval_error``, ``timeout`` or
``cancelled``; :func:`prorl_celery.trainer.client.reward_of`) is never handed to TRL as a reward.
``on_invalid`` chooses what happens to it:

- ``"resubmit"`` (the default): the rollout is run again (same instance and sampling, a new job
  id) up to ``max_resubmits`` times; one still invalid after that is dropped as below;
- ``"drop"``: the row is dropped at once.

TRL needs one row per prompt it passed (its groups have a fixed size), so a dropped row stays as
a placeholder: one masked-out token (``env_mask`` 0) and ``service_reward`` None. TRL (1.16)
leaves a row every reward function scored None out of its group's mean and standard deviation
and gives it advantage 0 (``unscorable_mask`` in ``GRPOTrainer._generate_and_score_completions``):
the row is dropped in effect. Other reward functions must return None for such rows too (each
receives the ``reward_valid`` and ``outcome`` columns), or TRL scores the placeholder. A call in
which not one row has a valid reward raises :class:`prorl_celery.trainer.client.RewardInvalid` naming the
outcomes: the service is broken, and a step of placeholders would train on nothing in silence.

Weights: before the rollouts of a new optimizer step, the trainer's model is saved
(``save_pretrained``, safetensors) under ``weights_dir`` and loaded into every vLLM server with
:class:`prorl_celery.trainer.weights.VLLMWeightSync` (pause in ``keep`` mode, reload, versions, resume):
the policy version is TRL's ``global_step``, so every rollout says which policy made it
(``policy_versions`` reaches the reward functions). Before the first rollouts, the gateway is
told that ``servers`` hold ``initial_step`` (``POST /llm_servers/version``), so the first step's
turns record version 0 too.

Paths: ``path="token"`` (the default) hands TRL the service's ids. ``path="text"`` is for
comparison experiments: it builds what a trainer that receives text would train on (the
messages re-rendered with the chat template and re-tokenized, :func:`retokenize`), without
rollout logprobs (a text trainer has none for its own tokenization; the server's are for other
ids, of another length).
"""
from __future__ import annotations

import difflib
import json
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prorl_celery.core.errors import BadRequest
from prorl_celery.trainer.client import (
    AsyncRolloutClient,
    JobRequest,
    LoopThread,
    RewardInvalid,
    RolloutOutcome,
    new_job_id,
    reward_of,
)
from prorl_celery.trainer.samples import samples_of

if TYPE_CHECKING:
    from prorl_celery.trainer.weights import VLLMWeightSync


def _key(prompt: Any) -> str:
    return json.dumps(prompt, sort_keys=True, ensure_ascii=False, default=str)


@dataclass
class StepTiming:
    step: int
    rollouts: int
    rollout_s: float
    weight_sync_s: float = 0.0
    policy_version: int = 0
    #: rows handed to TRL without a valid reward (placeholders, dropped in effect)
    failed: int = 0
    #: rollouts run again because their reward was not valid
    resubmitted: int = 0
    #: outcome class -> results whose reward was not valid (resubmitted or dropped)
    invalid: dict[str, int] = field(default_factory=dict)
    #: rows holding a training sample, and samples beyond ``samples_per_rollout`` left out
    samples: int = 0
    samples_left_out: int = 0


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
    #: "token": the service's ids, logprobs and mask; "text": the text path (module docstring)
    path: str = "token"
    #: the text path's tokenizer (``prorl_celery.llm.tokenizer.ChatTokenizer``) and the tool
    #: schemas its template renders (default: each trajectory's ``tools``, what the service rendered)
    text_tokenizer: Any = None
    text_tools: list[dict[str, Any]] | None = None
    #: per call on the text path: how far its ids drifted from the token path (:func:`drift`)
    path_stats: list[dict[str, float]] = field(default_factory=list)
    #: a sampler seed per rollout, from (this, TRL's step, the row): runs with the same seed
    #: sample the same rollouts from the same weights (e.g. the two paths compared), while the
    #: rollouts of a group still differ. None: the server's own randomness
    seed: int | None = None
    #: a rollout whose reward is not valid: "resubmit" (up to max_resubmits, then drop) or
    #: "drop" (module docstring)
    on_invalid: str = "resubmit"
    max_resubmits: int = 2
    #: rows each rollout fills (TRL's run of equal prompts must be a multiple of it): its
    #: training samples (``prorl_celery.trainer.samples_of``), the main agent's first, then
    #: sub-agents' and rewrites'; a rollout with fewer fills the rest with placeholders (no valid
    #: reward: out of the group's baseline, advantage 0), one with more keeps the first ones and
    #: counts the others in ``StepTiming.samples_left_out``. 1: the main agent's sample alone
    samples_per_rollout: int = 1
    #: rows for auxiliary samples too (calls under another model name, e.g. a small model's titles)
    train_auxiliary: bool = False
    #: replaces the network (an ``httpx.AsyncBaseTransport``; tests)
    transport: Any = None

    def __post_init__(self) -> None:
        if self.path not in ("token", "text"):
            raise ValueError(f"ProrlRollout: path must be 'token' or 'text', not {self.path!r}")
        if self.on_invalid not in ("resubmit", "drop"):
            raise ValueError(f"ProrlRollout: on_invalid must be 'resubmit' or 'drop', not {self.on_invalid!r}")
        if not isinstance(self.samples_per_rollout, int) or self.samples_per_rollout < 1:
            raise ValueError("ProrlRollout: samples_per_rollout must be a positive integer")
        if self.path == "text" and self.samples_per_rollout != 1:
            raise ValueError("ProrlRollout: the text path takes one sample per rollout (samples_per_rollout=1)")
        if self.path == "text" and self.text_tokenizer is None:
            raise ValueError("ProrlRollout: path='text' needs text_tokenizer= (a ChatTokenizer)")
        self._by_prompt: dict[str, dict[str, Any]] = {}
        for row in self.rows or ():
            row = dict(row)
            if "prompt" not in row:
                raise ValueError(f"a row given to ProrlRollout has no 'prompt' column: {sorted(row)}")
            self._by_prompt.setdefault(_key(row["prompt"]), row)
        self._synced_step = self.initial_step
        self._announced = False  # the gateway knows which step the servers hold
        self._loop = LoopThread("prorl-trl")
        self._saved: list[Path] = []
        self._sync: VLLMWeightSync | None = None  # made on the first push

    # -- TRL's side --------------------------------------------------------------------------

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        """TRL's rollout_func: one row per prompt (module docstring); raises RewardInvalid when
        not one row has a valid reward."""
        step = int(getattr(getattr(trainer, "state", None), "global_step", 0) or 0)
        if self.servers and not self._announced:
            self.announce_version(step)
        sync_s = self.sync_weights(trainer, step) if self.servers else 0.0
        started = time.monotonic()
        runs = self._loop.run(self._run(prompts, self._sampling_params(trainer), step))
        results = [run[-1] for run in runs]
        invalid = Counter(RolloutOutcome.of(r).outcome or "unknown"
                          for run in runs for r in run if reward_of(r) is None)
        dropped = [r for r in results if reward_of(r) is None]
        timing = StepTiming(step, len(results), time.monotonic() - started, sync_s, self._synced_step,
                            failed=len(dropped), resubmitted=sum(len(run) - 1 for run in runs), invalid=dict(invalid))
        self.timings.append(timing)
        if self.keep_results:
            self.results = results
        if dropped and len(dropped) == len(results):
            last = RolloutOutcome.of(dropped[-1])
            raise RewardInvalid(f"ProrlRollout: not one of {len(results)} rollouts has a valid reward (step {step}; "
                                f"outcomes {dict(invalid)}); last: {last.describe()}", last)
        out = self.to_trl(results, eos_id=_eos_id(trainer), samples_per_rollout=self.samples_per_rollout,
                          train_auxiliary=self.train_auxiliary)
        timing.samples = sum(1 for origin in out["sample_origin"] if origin is not None)
        timing.samples_left_out = sum(max(0, len(samples_of(r, include_auxiliary=self.train_auxiliary))
                                          - self.samples_per_rollout) for r in results if reward_of(r) is not None)
        if self.path == "text":
            stats = self.to_text_path(out, results, self.text_tokenizer, self.text_tools)
            self.path_stats.append(stats)
        return out

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
        top_p = getattr(args, "top_p", None)
        if top_p not in (None, 1.0):
            params["top_p"] = float(top_p)
        max_completion_length = getattr(args, "max_completion_length", None)
        if max_completion_length:
            params["max_tokens"] = int(max_completion_length)
        return params

    def _client(self) -> AsyncRolloutClient:
        return AsyncRolloutClient(self.gateway_url, token=self.token, transport=self.transport)

    async def _run(self, prompts: list[Any], sampling_params: dict[str, Any],
                   step: int = 0) -> list[list[dict[str, Any]]]:
        """Every result of each prompt's rollout, in order (the last is the one TRL gets)."""
        resubmits = self.max_resubmits if self.on_invalid == "resubmit" else 0
        async with self._client() as client:
            return await client.run_until_valid(self.requests(prompts, sampling_params, step),
                                                max_resubmits=resubmits, timeout_s=self.wait_timeout_s)

    def requests(self, prompts: list[Any], sampling_params: dict[str, Any], step: int = 0) -> list[JobRequest]:
        """One job per prompt. TRL repeats each prompt num_generations times in a row: a run of
        equal prompts is one group, its jobs as ``POST /jobs`` with ``num_samples`` makes them
        (ids ``<group>-<i>``, ``trajectory_id`` ``i``), each with its own seed when ``seed`` is set."""
        groups: list[tuple[dict[str, Any], int]] = []
        last = object()
        for prompt in prompts:
            key = _key(prompt)
            if groups and key == last:
                groups[-1] = (groups[-1][0], groups[-1][1] + 1)
            else:
                groups.append((self.instance(prompt), 1))
            last = key
        per = self.samples_per_rollout
        if any(n % per for _, n in groups):
            raise ValueError(f"ProrlRollout: samples_per_rollout={per} rows per rollout, but TRL passed runs of "
                             f"{sorted({n for _, n in groups})} equal prompts (num_generations must be a multiple)")
        groups = [(instance, n // per) for instance, n in groups]
        requests: list[JobRequest] = []
        for instance, n in groups:
            group_id, own = new_job_id("trl-"), instance.get("trajectory_id")
            for i in range(n):
                params = dict(sampling_params)
                if self.seed is not None:
                    params["seed"] = (self.seed * 1_000_003 + step * 10_007 + len(requests)) % 2 ** 31
                trajectory_id = i if own is None else f"{own}-{i}"
                requests.append(JobRequest({**instance, "trajectory_id": trajectory_id}, params, f"{group_id}-{i}",
                                           self.task, self.timeout_s))
        return requests

    @staticmethod
    def to_trl(results: list[dict[str, Any]], eos_id: int = 0, samples_per_rollout: int = 1,
               train_auxiliary: bool = False) -> dict[str, Any]:
        """TRL's rollout_func output from the service's results: ``samples_per_rollout`` rows
        each, in order, from its training samples (``samples_of``: the main agent's first).

        A job whose reward is not valid (:func:`prorl_celery.trainer.client.reward_of`), or that ended
        without a trajectory, and a row its rollout has no sample for, give a one-token
        completion masked out (``env_mask`` 0), ``service_reward`` None and ``reward_valid`` False:
        TRL leaves a row every reward function scored None out of the group's baseline, with
        advantage 0 (module docstring)."""
        out: dict[str, Any] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask",
                                                "service_reward", "reward_valid", "outcome", "policy_versions",
                                                "job_id", "status", "num_turns", "sample_origin")}
        for result in results:
            trajectory = result.get("trajectory") or {}
            outcome = RolloutOutcome.of(result).outcome
            valid = reward_of(result) is not None
            samples = samples_of(result, include_auxiliary=train_auxiliary) if valid else []
            for row in range(samples_per_rollout):
                sample = samples[row] if row < len(samples) else None
                ok = sample is not None and sample.reward is not None
                if ok:
                    assert sample is not None
                    out["prompt_ids"].append(sample.prompt_ids)
                    out["completion_ids"].append(sample.response_ids)
                    out["logprobs"].append(sample.response_logprobs)
                    out["env_mask"].append(sample.response_mask)
                    out["policy_versions"].append(sample.policy_versions or trajectory.get("policy_versions"))
                    out["num_turns"].append(sample.num_turns)
                else:  # a placeholder: the rollout's prompt for its first row, as TRL passed it
                    out["prompt_ids"].append(list(trajectory.get("prompt_ids") or [eos_id]) if row == 0 else [eos_id])
                    out["completion_ids"].append([eos_id])
                    out["logprobs"].append([0.0])
                    out["env_mask"].append([0])
                    out["policy_versions"].append(trajectory.get("policy_versions"))
                    out["num_turns"].append(len(trajectory.get("turns") or ()) if row == 0 else 0)
                out["service_reward"].append(sample.reward if ok and sample is not None else None)
                out["reward_valid"].append(ok)
                out["outcome"].append(outcome)
                out["job_id"].append(result.get("job_id"))
                out["status"].append(result.get("status"))
                out["sample_origin"].append(sample.origin if ok and sample is not None else None)
        return out

    @staticmethod
    def to_text_path(out: dict[str, Any], results: list[dict[str, Any]], chat: Any,
                     tools: list[dict[str, Any]] | None) -> dict[str, float]:
        """Turn :meth:`to_trl`'s output (in place) into the text path: every completed row's ids
        and mask from :func:`retokenize` (with ``tools``, or the trajectory's own), and no
        logprobs (``None``: TRL then has no sampling logprobs and computes its own). Returns the
        drift of the batch (:func:`drift`)."""
        paths: list[tuple[list[int], list[int], TextPath]] = []
        for row, result in enumerate(results):
            if not out["reward_valid"][row] or not any(out["env_mask"][row]):  # a dropped row's placeholder
                continue
            token_ids = out["prompt_ids"][row] + out["completion_ids"][row]
            token_mask = [0] * len(out["prompt_ids"][row]) + out["env_mask"][row]
            schemas = tools if tools is not None else (result.get("trajectory") or {}).get("tools")
            text = retokenize(chat, result.get("messages") or [], schemas, token_ids, token_mask)
            out["prompt_ids"][row] = text.ids[:text.prompt_len]
            out["completion_ids"][row] = text.ids[text.prompt_len:]
            out["env_mask"][row] = text.mask[text.prompt_len:]
            paths.append((token_ids, token_mask, text))
        out["logprobs"] = None
        return drift(paths)

    # -- weights -------------------------------------------------------------------------------

    def announce_version(self, step: int) -> None:
        """Before the first rollouts: tell the gateway that ``servers`` hold ``initial_step``
        (TRL's step 0: the weights they were started on), so every turn records that version.
        When training starts at a later step, :meth:`sync_weights` pushes weights and sets it."""
        self._announced = True
        if step != self._synced_step:
            return

        async def announce() -> None:
            async with self._client() as client:
                for address in self.servers:
                    try:
                        await client.set_policy_version(self._synced_step, address)
                    except BadRequest as error:
                        raise BadRequest(f"ProrlRollout: register servers= with the gateway (add_llm_server) "
                                         f"before training: {error.message}") from error

        self._loop.run(announce())

    def sync_weights(self, trainer: Any, step: int) -> float:
        """Push the trainer's weights to ``servers`` as policy version ``step``, when the servers
        hold an older step; seconds it took (0 when nothing was needed)."""
        if step == self._synced_step:
            return 0.0
        if self.weights_dir is None:
            raise ValueError("ProrlRollout: servers= needs weights_dir= (a directory the vLLM servers can read)")
        from prorl_celery.trainer.weights import VLLMWeightSync

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


# -- the text path ---------------------------------------------------------------------------


@dataclass
class TextPath:
    """A trajectory as a trainer that receives text builds it."""

    #: the conversation re-rendered with the chat template and re-tokenized
    ids: list[int]
    #: 1 = a model token (trained on): the assistant turns' tokens, with what the template
    #: writes inside them
    mask: list[int]
    #: where the completion starts (the prompt rendered with the generation prompt)
    prompt_len: int
    #: text position -> token-path position, or None for a token the token path does not have
    mapping: list[int | None]


def plain_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a text-receiving trainer gets: each message's role and text, the model's turns as it
    wrote them (its ``<tool_call>`` block included; the parsed calls are left out, or a template
    would render them a second time)."""
    return [{"role": m["role"], "content": m.get("content") or ""} for m in messages]


def align(token_ids: list[int], token_mask: list[int], text_ids: list[int]) -> tuple[list[int], list[int | None]]:
    """(text-path mask, text position -> token-path position or None). Text positions in a
    replaced or inserted span count as model tokens when the token path's span (or its left
    neighbour, for an insert) is the model's: tokens a template writes inside an assistant turn
    (Qwen3's empty think block) are trained on by a text-path trainer."""
    text_mask: list[int] = [0] * len(text_ids)
    mapping: list[int | None] = [None] * len(text_ids)
    matcher = difflib.SequenceMatcher(a=token_ids, b=text_ids, autojunk=False)
    for op, a0, a1, b0, b1 in matcher.get_opcodes():
        if op == "equal":
            for k in range(b1 - b0):
                mapping[b0 + k] = a0 + k
                text_mask[b0 + k] = token_mask[a0 + k]
        elif b1 > b0:
            model = any(token_mask[a0:a1]) if a1 > a0 else bool(a0 > 0 and token_mask[a0 - 1]) or \
                bool(a0 < len(token_mask) and token_mask[a0])
            for j in range(b0, b1):
                text_mask[j] = int(model)
    return text_mask, mapping


def cut_after_last_eot(ids: list[int], eot: int) -> list[int]:
    """The text path renders a newline after the last end-of-turn; the token path ends there."""
    last = max((i for i, t in enumerate(ids) if t == eot), default=len(ids) - 1)
    return ids[:last + 1]


def retokenize(chat: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               token_ids: list[int], token_mask: list[int]) -> TextPath:
    """The text path of one rollout: its messages (:func:`plain_messages`) rendered with
    ``chat``'s template (a ``ChatTokenizer``) and re-tokenized. The mask is the template's
    assistant turns, found by aligning to the token path (``token_ids``/``token_mask``, the
    service's): a text trainer finds the same spans from the template's turn markers."""
    plain = plain_messages(messages)
    ids = cut_after_last_eot(chat.encode(chat.render(plain, tools)), chat.eot_id)
    mask, mapping = align(token_ids, token_mask, ids)
    first = next((i for i, m in enumerate(plain) if m["role"] == "assistant"), len(plain))
    prompt = chat.prompt_ids(plain[:first], tools)
    if ids[:len(prompt)] == prompt:
        prompt_len = len(prompt)
    else:  # the template renders the prompt otherwise inside the whole conversation
        prompt_len = next((k for k, (a, b) in enumerate(zip(ids, prompt)) if a != b), min(len(ids), len(prompt)))
    mask[:prompt_len] = [0] * prompt_len
    return TextPath(ids, mask, prompt_len, mapping)


def drift(paths: Iterable[tuple[list[int], list[int], TextPath]]) -> dict[str, float]:
    """How far text paths are from their token paths (``(token_ids, token_mask, text)`` each):
    the fraction of trajectories whose ids differ, of the token path's model tokens the text
    path lacks, and the text path's model tokens the token path lacks, per trajectory."""
    n = differ = model = lost = added = 0
    for token_ids, token_mask, text in paths:
        n += 1
        differ += token_ids != text.ids
        kept = {a for a in text.mapping if a is not None}
        model += sum(token_mask)
        lost += sum(1 for k, m in enumerate(token_mask) if m and k not in kept)
        added += sum(1 for j, a in enumerate(text.mapping) if a is None and text.mask[j])
    return {"trajectories": n, "trajectories_differ": differ / max(1, n),
            "model_tokens_lost": lost / max(1, model),
            "model_tokens_added_per_trajectory": added / max(1, n)}


def service_reward(completions: list[Any] | None = None, service_reward: list[float | None] | None = None,
                   **_: Any) -> list[float | None]:
    """TRL reward function: the reward the service's EVAL gave each rollout (None for a row whose
    reward is not valid, which TRL leaves out of the group baseline with advantage 0)."""
    return list(service_reward or [None] * len(completions or ()))


def _eos_id(trainer: Any) -> int:
    processing = getattr(trainer, "processing_class", None)
    tokenizer = getattr(processing, "tokenizer", processing)
    value = getattr(tokenizer, "eos_token_id", None)
    return int(value) if value is not None else 0
