"""Running the LLM server: ``prorl llm-serve`` (foreground) and :class:`BackgroundServer`."""
from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import click

from prorl_celery.dev.devmodels import TOKENIZER_NAMES


class BackgroundServer:
    """uvicorn serving ``app`` on a loopback port from a daemon thread (tests, benches).

    The socket is bound before the thread starts, so ``url`` is valid at once and no other
    process can take the port in between.
    """

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0,
                 log_level: str = "warning") -> None:
        import uvicorn

        self.app = app
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host, self.port = self._socket.getsockname()[:2]
        config = uvicorn.Config(app, log_level=log_level, lifespan="off",
                                timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                        name=f"llm-server-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the LLM server on {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def build_engine(*, model: str | None, scripted: str | None, tokenizer: str | None,
                 token_delay: float = 0.0, seed: int = 0, model_name: str | None = None,
                 max_model_len: int | None = None) -> Any:
    """The engine the command-line options describe (exactly one of model and scripted)."""
    from prorl_celery.dev.llm_server.engines import ScriptedEngine, TorchEngine

    if (model is None) == (scripted is None):
        raise click.UsageError("give exactly one of --model DIR and --scripted RULES.json")
    if model is not None:
        return TorchEngine(model, tokenizer=tokenizer, model_name=model_name)
    assert scripted is not None  # exactly one of the two was given (checked above)
    return ScriptedEngine(tokenizer or "qwen3", Path(scripted), token_delay_s=token_delay,
                          seed=seed, model_name=model_name, max_model_len=max_model_len or 32768)


@click.command("llm-serve")
@click.option("--model", "model", metavar="DIR",
              type=click.Path(exists=True, file_okay=False),
              help="serve a Hugging Face causal LM on CPU (torch); the tiny fixture model is "
                   "$(prorl fixtures path)/tiny-qwen2-qwen3-v1")
@click.option("--scripted", metavar="RULES.json", type=click.Path(exists=True, dir_okay=False),
              help='scripted replies: [{"match": regex, "replies": [...], "scope": "last_user"|"prompt", '
                   '"delay_s": 0, "seed_mod": [m, r]}]; [] = always random (docs/testing.md)')
@click.option("--tokenizer", metavar="DIR|qwen3|llama3",
              help="tokenizer directory or built-in fixture name (scripted default: qwen3)")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--token-delay", default=0.0, show_default=True, type=float,
              help="seconds between generated tokens (scripted)")
@click.option("--seed", default=0, show_default=True, type=int, help="seed of the random replies")
@click.option("--model-name", default=None, help="name reported by /v1/models")
@click.option("--max-model-len", type=int, default=None,
              help="context length the scripted server enforces and reports (default 32768)")
@click.option("--log-level", default="info", show_default=True)
@click.option("--log-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="append every generation answered to this file, one JSON line each (the /_log record), "
                   "written before its answer is sent")
def llm_serve(model: str | None, scripted: str | None, tokenizer: str | None, host: str, port: int,
              token_delay: float, seed: int, model_name: str | None, max_model_len: int | None,
              log_level: str, log_file: Path | None) -> None:
    """Serve an LLM over the vLLM, SGLang and llama.cpp protocols."""
    import uvicorn

    if tokenizer is not None and tokenizer not in TOKENIZER_NAMES and not Path(tokenizer).is_dir():
        raise click.BadParameter(f"{tokenizer!r} is neither a directory nor one of "
                                 f"{', '.join(TOKENIZER_NAMES)}", param_hint="--tokenizer")

    from prorl_celery.dev.llm_server.app import create_llm_app

    try:
        engine = build_engine(model=model, scripted=scripted, tokenizer=tokenizer,
                              token_delay=token_delay, seed=seed, model_name=model_name,
                              max_model_len=max_model_len)
    except ValueError as error:  # JSONDecodeError and pydantic's ValidationError too
        if scripted is None:
            raise
        first = str(error).splitlines()[0]
        raise click.BadParameter(f"{scripted} is not a rules file ({first}): a JSON list of "
                                 '{"match": regex, "replies": [...]}', param_hint="--scripted") from error
    click.echo(f"serving {engine.model_name} on http://{host}:{port}", err=True)
    uvicorn.run(create_llm_app(engine, log_file=log_file), host=host, port=port, log_level=log_level)
