"""Every Redis key and channel of the service; no other module spells one.

=================================  ======  =====================================================
key                                type    meaning
=================================  ======  =====================================================
prorl:job:<id>                     hash    job record: task, status, payload, stage results,
                                           timer (budget_s, active_s, resumed_at), stage
                                           durations (init_s, run_s, eval_s), backend, result,
                                           lease_until of the executing stage, <stage>_node
                                           (where it ran), run_queue (run.<node> if node-local),
                                           prefer_backend (a fork's: routed there while healthy)
prorl:job:<id>:journal             list    the job's per-turn journal (state/journal.py): one
                                           JSON event a line (prompt, model turn, tool action,
                                           observation, segment); expires with the job
                                           (transition.lua), bounded by PRORL_JOURNAL_MAX_*
prorl:job:<id>:journal:meta        hash    the journal's writer attempt (a stage of an older
                                           attempt may not append), bytes, and why it stopped
                                           (full); expires with the job
prorl:jobs:ended                   stream  {job, status} for every job that ends (capped at
                                           JOBS_ENDED_MAXLEN); one listener per process tails it
                                           and wakes that process's waiters (waiting.py)
prorl:jobs:recent                  zset    job id -> creation time (trimmed), for listings
prorl:jobs:active                  set     ids of jobs not yet ended (for /stop and the backfill)
prorl:jobs:leases                  zset    job id -> lease deadline (Redis time) of its executing
                                           stage: written by the claim (transition.lua) and
                                           renew_leases.lua, dropped when the stage ends; the
                                           reaper reads the expired ones only
prorl:jobs:waiting_run             hash    queue -> the node it is local to, for every node's
                                           queue (run.<node>) with jobs in pending_run; the
                                           shared run queue is not listed (no node to lose)
prorl:jobs:waiting_run:<queue>     set     ids of the jobs in pending_run waiting in <queue>
                                           (run, run.<node>): a dead node's are the stranded ones
prorl:jobs:unclaimed:<status>      zset    job id -> when (Redis time) it entered <status>, for
                                           pending_init and pending_eval (their queues are
                                           consumed without acks): written by create_job.lua and
                                           transition.lua; the reaper publishes a job again whose
                                           message was lost (leases.republish_lost)
prorl:stats:status                 hash    status -> number of jobs currently in it (terminal
                                           statuses count every job that ended there)
prorl:stats:minute:<unix minute>   hash    jobs that ended in that minute: terminal status ->
                                           count, "outcome:<class>" -> count, "reward_sum" of the
                                           completed ones (written by transition.lua, expires
                                           after MINUTE_STATS_TTL_S)
prorl:stats:outcomes               hash    outcome class (prorl_celery.core.outcomes) -> jobs that
                                           ended with it (transition.lua)
prorl:service:state                string  "started" | "stopped" (cluster wide)
prorl:llm:backends                 zset    backend address -> jobs assigned (the router's heap)
prorl:llm:types                    hash    backend address -> protocol (vllm | sglang | llamacpp)
prorl:llm:inflight                 hash    backend address -> jobs in RUN on it now
prorl:llm:generation               string  bumped by /clear_llm_server
prorl:llm:versions                 hash    backend address -> policy version (set by the trainer)
prorl:llm:health                   hash    backend address -> JSON {healthy, since, detail}: what
                                           its last probe (or a RUN that found it not answering) said
prorl:llm:unhealthy                set     backend addresses out of routing until a probe answers
                                           (acquire_backend.lua skips them)
prorl:llm:probe:<address>          string  owner of the next re-probe of that unhealthy backend
                                           (SET NX EX the probe interval: one probe per interval)
prorl:reaper:lock                  string  owner of the lease reaper (expires, so a dead owner lapses)
prorl:node:<node>:addresses        hash    loopback address -> sandbox that leases it
prorl:node:<node>:sandboxes        hash    sandbox id -> ledger record (JSON): job, worker, pids
prorl:metrics:counters             hash    counter name -> total (tokens, LLM requests, lease expiries)
prorl:metrics:stage:<stage>        hash    duration histogram as versions before the one below
                                           wrote it: bucket bound -> cumulative count, "sum"
prorl:metrics:buckets:<stage>      hash    duration histogram: bucket bound -> stages that fell
                                           in that bucket only (not cumulative: a stage counts
                                           in one bucket), "sum"; read_metrics adds the two up
prorl:workers                      zset    worker name -> last heartbeat (unix time)
prorl:worker:<name>                hash    worker's node, queues, pid, concurrency, stages it
                                           holds now (busy), software versions (JSON)
prorl:nodes                        zset    node -> last heartbeat of any of its workers (unix
                                           time); a node silent for a day is forgotten
prorl:nodes:drain                  hash    node -> when a drain was asked (unix time): its
                                           workers take no new INIT or RUN work (nodes.py)
prorl:cancel                       pubsub  job ids being cancelled (a wake-up; the job record
                                           stays the source of truth)
init, run, run.<node>, eval        list    Celery's own queues on the broker (kombu's names;
                                           read for queue depth, never written by us)
=================================  ======  =====================================================
"""
from __future__ import annotations

PREFIX = "prorl:"

RECENT_JOBS = PREFIX + "jobs:recent"
ACTIVE_JOBS = PREFIX + "jobs:active"
LEASES = PREFIX + "jobs:leases"
WAITING_RUN_QUEUES = PREFIX + "jobs:waiting_run"
WAITING_RUN = PREFIX + "jobs:waiting_run:"  # + the queue; also built in lua/ from this prefix
UNCLAIMED = PREFIX + "jobs:unclaimed:"  # + the status (pending_init, pending_eval)
JOBS_ENDED = PREFIX + "jobs:ended"
JOBS_ENDED_MAXLEN = 100_000  # also written in lua/transition.lua
STATUS_COUNTS = PREFIX + "stats:status"
OUTCOME_COUNTS = PREFIX + "stats:outcomes"
MINUTE_STATS = PREFIX + "stats:minute:"  # + the minute's start in unix seconds
MINUTE_STATS_TTL_S = 2 * 3600  # the dashboard charts the last hour
SERVICE_STATE = PREFIX + "service:state"
REPLICATION_MARK = PREFIX + "service:replicated"  # written right before a WAIT (JobStore.wait_replicated)
LLM_BACKENDS = PREFIX + "llm:backends"
LLM_TYPES = PREFIX + "llm:types"
LLM_INFLIGHT = PREFIX + "llm:inflight"
LLM_GENERATION = PREFIX + "llm:generation"
LLM_VERSIONS = PREFIX + "llm:versions"
LLM_HEALTH = PREFIX + "llm:health"
LLM_UNHEALTHY = PREFIX + "llm:unhealthy"
WORKERS = PREFIX + "workers"
NODES = PREFIX + "nodes"
NODES_DRAIN = PREFIX + "nodes:drain"
REAPER_LOCK = PREFIX + "reaper:lock"
METRIC_COUNTERS = PREFIX + "metrics:counters"
CANCEL_CHANNEL = PREFIX + "cancel"


def job(job_id: str) -> str:
    return f"{PREFIX}job:{job_id}"


def journal(job_id: str) -> str:
    """The job's per-turn journal (a list of JSON events; ``prorl_celery.state.journal``)."""
    return f"{PREFIX}job:{job_id}:journal"


def journal_meta(job_id: str) -> str:
    """The journal's writer attempt, size and state."""
    return f"{PREFIX}job:{job_id}:journal:meta"


def waiting_run(queue: str) -> str:
    """Ids of the jobs in ``pending_run`` whose RUN message waits in ``queue``."""
    return f"{WAITING_RUN}{queue}"


def unclaimed(status: str) -> str:
    """Ids of the jobs in ``status`` (pending_init, pending_eval) by when they entered it."""
    return f"{UNCLAIMED}{status}"


def minute_stats(minute_start: int) -> str:
    """Jobs that ended in the minute starting at ``minute_start`` (unix seconds, a multiple of 60)."""
    return f"{MINUTE_STATS}{minute_start}"


def llm_probe_lock(address: str) -> str:
    """Held by the process that re-probes the unhealthy backend ``address`` this interval."""
    return f"{PREFIX}llm:probe:{address}"


def node_addresses(node: str) -> str:
    return f"{PREFIX}node:{node}:addresses"


def node_sandboxes(node: str) -> str:
    return f"{PREFIX}node:{node}:sandboxes"


def stage_histogram(stage: str) -> str:
    return f"{PREFIX}metrics:stage:{stage}"


def stage_buckets(stage: str) -> str:
    return f"{PREFIX}metrics:buckets:{stage}"


def worker(name: str) -> str:
    return f"{PREFIX}worker:{name}"


#: database 0 of a Sentinel group run by ``prorl sentinel member``: the id of the group told to
#: stop (prorl_celery.dev.sentinel_member)
SENTINEL_GROUP_STOP = f"{PREFIX}sentinel-group:stop"


def broker_queue(name: str) -> str:
    """Kombu's Redis transport keeps a queue's messages in a list named after the queue."""
    return name


#: kombu's Redis transport keeps a message of priority p in the list ``<queue><sep><p>`` (p > 0;
#: its ``Channel.sep`` and ``PRIORITY_STEPS``, checked in tests/integration/test_unclaimed_index.py): it LPUSHes and
#: BRPOPs from the right end, so a list's oldest message is its last
BROKER_PRIORITY_SEP = "\x06\x16"
BROKER_PRIORITY_STEPS = (0, 3, 6, 9)


def broker_queue_lists(name: str) -> list[str]:
    """Every list of queue ``name``: the plain one (priority 0) and its priority lists."""
    return [name if step == 0 else f"{name}{BROKER_PRIORITY_SEP}{step}" for step in BROKER_PRIORITY_STEPS]
