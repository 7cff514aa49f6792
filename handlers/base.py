"""The handler plug-in interface.

A handler holds the task logic of one task family (math, code, swe, stem) and nothing else:
it never imports Redis, Celery or Flask. The pipeline calls it once per stage and hands it
what it needs as arguments:

    parse_instance(instance)  -> the instance in the handler's own shape (job.parsed_instance)
    init(job)                 -> dict            stored as job.init_result
    run(job, llm)             -> dict            stored as job.run_result (llm: None when uses_llm is False)
    eval(job)                 -> EvalResult      reward and details
    <stage>_exception(job, e) -> fallback of the same type, so the job still ends well-formed
    final_result(job)         -> dict            extra fields merged into the job's final result

A stage that raises is classed by the pipeline (``prorl_celery.core.outcomes``): a failure outside
the policy is retried while the job has attempts left, then ends the job with its fallback, and
its reward is not valid. An evaluator that cannot judge raises (``EvalUnavailable`` names why):
it never returns 0. The policy's own failure (``AgentFailure``, a context that ran out) in RUN
still goes to EVAL with run_exception's fallback as run_result. Everything a handler returns
must be JSON-serialisable: stages may run on different workers and nodes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

from handlers.volatile import VolatileField
from prorl_celery.core.status import Stage
from singularity.requirements import Requirement


@dataclass(frozen=True)
class Generation:
    """One model turn as the backend produced it."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (end of turn or stop sequence) | "length" (max_tokens hit)


@runtime_checkable
class ChatLLM(Protocol):
    """One conversation with the job's LLM backend, token-in/token-out underneath.

    The pipeline implements this (prorl_celery.llm.session.TokenSession) and reads the
    token-level trajectory from it after RUN; the handler only speaks in messages.
    """

    def start(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> None:
        """Begin the conversation with its first messages (system/user), tokenized once."""

    async def generate(self, **sampling_overrides: Any) -> Generation:
        """Ask the model for the next assistant turn; it is appended to the conversation."""

    def add_message(self, role: str, content: str, **fields: Any) -> None:
        """Append an observation (a user or tool message); only its new tokens are added."""

    def note_action(self, name: str | None, arguments: Any) -> None:
        """Record a tool action taken after the last model turn (before its observation is
        added): the job's journal keeps it, and a resume or replay checks it is the same."""

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The readable conversation so far."""

    @property
    def num_turns(self) -> int:
        """Number of model turns generated so far."""

    @property
    def context_left(self) -> int:
        """Tokens left before the model's context length is reached."""


#: what RUN's ``llm`` is for a handler class: ``ChatLLM`` (the pipeline's conversation) when it
#: uses an LLM, ``None`` when it sets ``uses_llm = False``; see ``AgentHandler``
LLMT = TypeVar("LLMT", bound=ChatLLM | None)


@dataclass(frozen=True)
class EndpointRequest:
    """A per-job LLM endpoint for an agent program in the job's sandbox (OpenAI-compatible, token
    exact: DESIGN decision 14). The pipeline serves it over RUN's token session, on a Unix socket
    beside the tool server's, for the time of RUN, and hands it to ``run`` as ``job.endpoint``."""

    model: str = "policy"  # the model name the endpoint answers to
    max_calls: int | None = None  # LLM calls it allows (the job's max_iterations)
    #: model names the harness was configured to use for a small fast model (titles, summaries):
    #: their calls are ``auxiliary`` samples (``prorl_celery/endpoint/samples.py``)
    auxiliary_models: tuple[str, ...] = ()
    #: fields the program's own tools make different on every run (a fresh id, a duration): a
    #: resume compares its replayed observations with the journaled ones past these fields only
    #: (``handlers.volatile``); empty, every character is compared
    volatile_fields: tuple[VolatileField, ...] = ()


@runtime_checkable
class JobEndpoint(Protocol):
    """What ``run`` knows of its job's endpoint (``job.endpoint``)."""

    key: str  # the bearer key the program must send
    socket: str  # the endpoint's Unix socket, as the sandbox sees it
    model: str

    def summary(self) -> dict[str, Any]:
        """Calls, segments, drift events and refusals so far, for the job's result."""


@dataclass
class JobContext:
    """What a handler knows about the job it works on."""

    job_id: str
    task: str
    instance: dict[str, Any]
    sampling_params: dict[str, Any] = field(default_factory=dict)  # sampler keys (prorl_celery.llm.sampling)
    #: agent keys of sampling_params: max_iterations, max_output_tokens, max_input_tokens, ...
    agent_params: dict[str, Any] = field(default_factory=dict)
    init_result: dict[str, Any] = field(default_factory=dict)
    run_result: dict[str, Any] = field(default_factory=dict)
    deadline: float | None = None  # time.monotonic() value at which the job's budget runs out
    attempt: int = 1  # > 1 when the job is retried from INIT after its worker was lost
    #: during INIT and RUN of a job that asked for a sandbox: a connected
    #: ``singularity.toolserver.client.ToolClient`` (bash, ipython, editor, search)
    sandbox: Any = None
    #: ``instance`` in the handler's own shape, parsed on first use (``AgentHandler.instance_of``)
    parsed_instance: Any = None
    #: during RUN of a job whose handler asks for one (``endpoint_request``): a ``JobEndpoint``
    endpoint: Any = None

    def time_left(self) -> float | None:
        """Seconds of budget left, or None when the job has no budget."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())


@dataclass(frozen=True)
class SandboxRequest:
    """The sandbox a job needs; INIT starts it on its node, it is closed right after RUN."""

    image: str = "dev"
    network: bool = False
    memory_bytes: int | None = 4 * 2**30
    max_processes: int | None = 512
    cpu_seconds: int | None = None
    #: host paths made visible read-only inside the sandbox, as ``(host_path, inside_path)``
    #: pairs: a handler's shipped data (repositories, corpora) without copying it per job
    binds: tuple[tuple[str, str], ...] = ()
    #: a JSONL file of ``{"id", "title", "text"}`` (path inside the sandbox, usually under a
    #: bind) that the ``search`` tool indexes with BM25; None: no search tool
    search_corpus: str | None = None
    #: the tools the job will call that are slow to start: ``"python"`` (the IPython kernel) and
    #: ``"search"`` (the corpus index). A warm pool keeps sandboxes per request, these started
    #: (the shell always is); a sandbox started for a miss starts them on first use, as before
    tools: tuple[str, ...] = ()


@dataclass
class EvalResult:
    """A judgement: ``reward`` is None only for a task that asked for none (an agent instance
    with ``evaluator: none``); the result then carries ``reward: null``, ``reward_valid: false``."""

    reward: float | None
    details: dict[str, Any] = field(default_factory=dict)
    #: a reward of its own for some of the rollout's training samples, by their index in the
    #: trajectory's ``samples`` (the endpoint's summary in ``run_result`` names each one's
    #: origin); every sample not named here has ``reward`` (DESIGN decision 19)
    sample_rewards: dict[int, float] | None = None


class AgentHandler(Generic[LLMT]):
    """Base class of every task handler; subclasses override the three stages.

    RUN gets the job's conversation when the class uses an LLM (``uses_llm``, the default) and
    None when it does not, so a typed handler says which it is: ``AgentHandler[ChatLLM]`` for
    the former, ``AgentHandler[None]`` with ``uses_llm = False`` for the latter. A bare
    ``AgentHandler`` leaves ``llm`` untyped.

    Register a handler under a task name with the setuptools entry point group
    ``prorl.handlers`` (``math = handlers.math:MathHandler``), so a new task family is a
    separate package and needs no server change.
    """

    name: ClassVar[str] = ""
    #: other names a job may use for this task (``instance.data_source`` of public data sets)
    aliases: ClassVar[tuple[str, ...]] = ()
    #: True when RUN must execute on the node whose INIT started the job's sandbox.
    node_local: ClassVar[bool] = False
    #: False for handlers whose RUN needs no LLM backend (``run`` then receives ``llm=None``).
    uses_llm: ClassVar[bool] = True
    #: Stages whose messages may carry several of this task's jobs (``PRORL_STAGE_BATCH`` at
    #: most): one message and one round trip of claims, hand-overs and publishes per chunk
    #: instead of per job, the chunk's stages running together on one worker thread's loop. Only
    #: for stages that are short and CPU-light: an INIT chunk's jobs are not spread over the INIT
    #: pool's threads, so its ``-c`` would no longer bound concurrent sandbox starts. A job whose
    #: INIT or EVAL asks for a sandbox (``sandbox_request``, ``eval_sandbox_request``) is always
    #: published alone, whatever this says (see ``shares_messages``).
    batched_stages: ClassVar[frozenset[Stage]] = frozenset()
    #: everything this task family may need from its sandboxes (``singularity.requirements``:
    #: its tools' ``requires``, a test runner, a program). A worker that lacks any of it names
    #: the task in its log and in ``/status`` at start, and refuses each job that needs it
    #: (``requirements``) as an ``env_error``: never a score.
    requires: ClassVar[tuple[Requirement, ...]] = ()
    #: True when this family's tools answer the same actions with the same observations on a
    #: fresh sandbox (given the same instance), so a RUN retried after a crash may rebuild the
    #: sandbox by replaying the journaled actions and go on from the last journaled turn. Each
    #: replayed observation is still checked: one that differs restarts the rollout from turn
    #: zero. False: a retried RUN always starts from turn zero (and its result says why).
    replayable_tools: ClassVar[bool] = False

    def replayable(self, job: JobContext) -> bool:
        """May ``job``'s RUN be resumed by replaying its journal? ``replayable_tools`` by
        default (narrow it when an instance uses a tool that is not deterministic)."""
        return self.replayable_tools

    def requirements(self, job: JobContext) -> tuple[Requirement, ...]:
        """What ``job`` needs; by default everything ``requires`` names (narrow it when an
        instance may leave a tool out)."""
        return self.requires

    def shares_messages(self, stage: Stage, job: JobContext) -> bool:
        """May ``job``'s ``stage`` message carry other jobs too? Only for ``batched_stages``, and
        never for an INIT or EVAL that starts a sandbox."""
        if stage not in self.batched_stages:
            return False
        if stage is Stage.INIT:
            return self.sandbox_request(job) is None
        if stage is Stage.EVAL:
            return self.eval_sandbox_request(job) is None
        return True

    def sandbox_request(self, job: JobContext) -> SandboxRequest | None:
        """The sandbox this job needs, or None. A job with a sandbox runs RUN on INIT's node."""
        return None

    def endpoint_request(self, job: JobContext) -> EndpointRequest | None:
        """A per-job LLM endpoint for an agent program in the sandbox during RUN, or None."""
        return None

    def eval_sandbox_request(self, job: JobContext) -> SandboxRequest | None:
        """A fresh sandbox for EVAL (hidden tests must not run where the agent worked), or None.

        Started on the EVAL worker's node right before ``eval`` (as ``job.sandbox``) and stopped
        right after it, whatever happens.
        """
        return None

    def parse_instance(self, instance: dict[str, Any]) -> Any:
        """The instance in this handler's own shape (a dataclass, say), or ValueError naming the
        missing or wrong field. The default keeps the dict as it is."""
        return instance

    def validate_instance(self, instance: dict[str, Any]) -> None:
        """Raise ValueError with a clear message when an instance cannot be served.

        Called by the gateway before a job is accepted, so bad input is a 400, not a failed job.
        The default parses it (``parse_instance``).
        """
        self.parse_instance(instance)

    def instance_of(self, job: JobContext) -> Any:
        """``job.instance`` parsed, once per ``JobContext``: the first call of a stage parses
        it, every later one reuses it. Each stage parses it anew, because a stage may run on
        another node, whose files (a swe repository's bundle) are its own."""
        if job.parsed_instance is None:
            job.parsed_instance = self.parse_instance(job.instance)
        return job.parsed_instance

    async def init(self, job: JobContext) -> dict[str, Any]:
        return {}

    async def run(self, job: JobContext, llm: LLMT) -> dict[str, Any]:
        raise NotImplementedError

    async def eval(self, job: JobContext) -> EvalResult:
        raise NotImplementedError

    async def init_exception(self, job: JobContext, error: BaseException) -> dict[str, Any]:
        return {"error": f"{type(error).__name__}: {error}"}

    async def run_exception(self, job: JobContext, error: BaseException) -> dict[str, Any]:
        return {"error": f"{type(error).__name__}: {error}"}

    async def eval_exception(self, job: JobContext, error: BaseException) -> EvalResult:
        """Details to keep when ``eval`` raised. Its reward is never used: an evaluation that
        failed ends the job ``eval_error`` (retried while attempts are left), never a score."""
        return EvalResult(reward=0.0, details={"error": f"{type(error).__name__}: {error}"})

    def final_result(self, job: JobContext) -> dict[str, Any]:
        """Extra fields for the job's final result: ``artifacts``, and ``tool_log`` (name,
        seconds and error of every tool call) when RUN went through the shared agent loop."""
        extra: dict[str, Any] = {"artifacts": job.run_result.get("artifacts", {})}
        if job.run_result.get("tool_log") is not None:
            extra["tool_log"] = job.run_result["tool_log"]
        return extra
