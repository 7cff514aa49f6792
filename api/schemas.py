"""Request and response models of the gateway; unknown fields are errors, not silence."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, field_validator, model_validator

from prorl_celery.core.forks import GROUP_ID_MAX, JOB_ID_MAX, MAX_FORKS, is_group_id
from prorl_celery.llm.sampling import KNOWN_KEYS as KNOWN_SAMPLING_KEYS
from prorl_celery.llm.sampling import unknown_key_message

JOB_ID_PATTERN = rf"^[A-Za-z0-9_.:\-]{{1,{JOB_ID_MAX}}}$"


class SamplingParams(BaseModel):
    """A v1 ``sampling_params``: sampler, agent and trainer-side keys side by side.

    Known keys are type-checked here; ``prorl_celery.llm.sampling.split`` decides what each one
    does. The other keys v1 trainers send are known too (trainer-side: accepted, never sent); any
    key beyond those is refused, naming the closest known one; ``extra`` carries engine-specific
    keys to the LLM server on purpose.
    """

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _known_keys_only(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in data:
                if key not in KNOWN_SAMPLING_KEYS:
                    raise ValueError(unknown_key_message(key))
        return data

    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = None
    min_p: float | None = Field(None, ge=0, le=1)
    max_tokens: int | None = Field(None, gt=0)
    seed: int | None = None
    stop_token_ids: list[int] | None = None
    max_iterations: int | None = Field(None, ge=1, description="model turns (the instance's value wins)")
    max_output_tokens: int | None = Field(None, gt=0, description="tokens per model turn")
    max_input_tokens: int | None = Field(None, gt=0, description="no turn starts from a longer context")
    max_model_len: int | None = Field(None, gt=0, description="context cap, below PRORL_MAX_MODEL_LEN")
    custom_tokenizer: str | None = Field(None, description="tokenizer directory, or a name under PRORL_TOKENIZERS_DIR")
    tokenizer: str | None = Field(None, description="tokenizer directory overriding PRORL_TOKENIZER")
    extra: dict[str, Any] | None = Field(None, description="engine-specific sampler keys, sent to the LLM "
                                         "server as they are")

    def to_job(self) -> dict[str, Any]:
        """Every key the client sent, extra ones included, for the split."""
        return self.model_dump(exclude_none=True)


class ProcessRequest(BaseModel):
    """The ProRL Agent Server body of ``/process`` and ``/jobs``."""

    model_config = ConfigDict(extra="forbid")

    instance: dict[str, Any] = Field(description="task instance; data_source names the handler")
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    job_id: str | None = Field(None, pattern=JOB_ID_PATTERN, description="idempotency key")
    task: str | None = Field(None, min_length=1, description="handler name; default instance.data_source")
    timeout_s: float | None = Field(None, gt=0, description="active-time budget; default PRORL_JOB_TIMEOUT_S")
    max_attempts: int | None = Field(None, ge=1, le=10,
                                     description="retries from INIT after a lost worker; default PRORL_MAX_ATTEMPTS")
    num_samples: int | None = Field(None, ge=1, le=4096,
                                    description="POST /jobs: this many rollouts of the instance (a group)")

    @model_validator(mode="after")
    def _task_named(self) -> ProcessRequest:
        if not self.task and not isinstance(self.instance.get("data_source"), str):
            raise ValueError("name the task: give 'task' or 'instance.data_source'")
        if self.job_id and self.num_samples:  # the group's jobs are <job_id>-<i>: each a valid job id
            room = JOB_ID_MAX - len(f"-{self.num_samples - 1}")
            if len(self.job_id) > room:
                raise ValueError(f"job_id: with num_samples {self.num_samples} its jobs are <job_id>-<i>, so job_id "
                                 f"may have at most {room} characters, got {len(self.job_id)}")
        return self

    @property
    def task_name(self) -> str:
        return self.task or self.instance["data_source"]


class CancelRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job_id: str | None = Field(None, pattern=JOB_ID_PATTERN)
    job_ids: list[str] | None = None

    @model_validator(mode="after")
    def _one_form(self) -> CancelRequest:
        if (self.job_id is None) == (self.job_ids is None):
            raise ValueError("give exactly one of 'job_id' or 'job_ids'")
        return self

    @property
    def ids(self) -> list[str]:
        return [self.job_id] if self.job_id else list(self.job_ids or [])


class AddServerRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    address: HttpUrl = Field(description="e.g. http://host:8000/v1")
    type: Literal["vllm", "sglang", "llamacpp"] = "vllm"
    version: int | None = Field(None, ge=0, description="policy version the server holds")

    @property
    def normalized_address(self) -> str:
        return str(self.address).rstrip("/")


class ClearServerRequest(BaseModel):
    """``POST /clear_llm_server``: one backend by address, or (no body, or no address) all."""

    model_config = ConfigDict(extra="forbid")

    address: HttpUrl | None = Field(None, description="one registered backend (http://h:p and http://h:p/v1 "
                                    "name the same server); default every one")

    @property
    def normalized_address(self) -> str | None:
        return str(self.address).rstrip("/") if self.address is not None else None


class SetVersionRequest(BaseModel):
    """``POST /llm_servers/version``: the trainer loaded new weights into a backend (or all)."""

    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=0, description="the policy version now served")
    address: HttpUrl | None = Field(None, description="one registered backend; default every one")

    @property
    def normalized_address(self) -> str | None:
        return str(self.address).rstrip("/") if self.address is not None else None


class JobAccepted(BaseModel):
    job_id: str
    status: str
    created: bool


#: most job ids one POST /jobs/wait may carry (as many as one POST /jobs may create)
MAX_WAIT_IDS = 10_000


class WaitRequest(BaseModel):
    """``POST /jobs/wait``: stream each job's result as it ends."""

    model_config = ConfigDict(extra="forbid")

    job_ids: list[Annotated[str, Field(pattern=JOB_ID_PATTERN)]] = Field(
        min_length=1, max_length=MAX_WAIT_IDS, description=f"1 to {MAX_WAIT_IDS} job ids (repeats count once)")
    timeout_s: float = Field(600.0, ge=0, le=3600,
                             description="then one pending line per job still running, and the end")
    heartbeat_s: float = Field(5.0, ge=0.05, le=60,
                               description="a bare newline this often while nothing ends (keep-alive)")


class ReplayRequest(BaseModel):
    """``POST /jobs/replay``: replay many finished jobs (re-scoring a data set)."""

    model_config = ConfigDict(extra="forbid")

    job_ids: list[Annotated[str, Field(pattern=JOB_ID_PATTERN)]] = Field(
        min_length=1, max_length=MAX_WAIT_IDS, description="the finished jobs to replay")


class ForkRequest(BaseModel):
    """``POST /jobs/<id>/fork``: ``count`` jobs sharing turns 1..``turn`` of the job."""

    model_config = ConfigDict(extra="forbid")

    turn: int = Field(ge=0, description="the shared turns (0: the prompt only)")
    count: int = Field(1, ge=1, le=MAX_FORKS, description="forks to start")
    group_id: str | None = Field(None, description=f"idempotency key: the forks are <group_id>-<i>, and a repeated "
                                 f"request starts none (1 to {GROUP_ID_MAX} of A-Z a-z 0-9 _ . : -)")

    @field_validator("group_id")
    @classmethod
    def _group_id(cls, value: str | None) -> str | None:
        if value is not None and not is_group_id(value):
            # the forks' ids, <group_id>-<i>, must be valid job ids
            raise ValueError(f"1 to {GROUP_ID_MAX} characters of A-Z a-z 0-9 _ . : - (each fork's id, "
                             f"<group_id>-<i>, is a job id of at most {JOB_ID_MAX}), got {value!r}")
        return value
