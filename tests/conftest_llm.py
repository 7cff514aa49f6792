"""Fixtures for tokenizers, the tiny model and HTTP LLM servers (import from tests/conftest.py).

    qwen3_tokenizer_dir, llama3_tokenizer_dir   session: built/cached tokenizer directories
    qwen3_hf_tokenizer, llama3_hf_tokenizer           session: loaded tokenizers
    tiny_model_dir                              session: the tiny Qwen2 model (skips without torch)
    llm_server                                  factory: llm_server(engine) -> started
                                                BackgroundServer (``.url``), stopped after the test
    scripted_llm_server                         factory: scripted_llm_server(rules,
                                                tokenizer="qwen3", **engine_kwargs) -> started
                                                BackgroundServer

The first run builds the fixtures into ``$PRORL_FIXTURES_DIR`` (default
``~/.cache/prorl-celery/fixtures``), downloading the llama-cpp-python sdist from PyPI unless
``$PRORL_LLAMACPP_SDIST`` names a local copy.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from prorl_celery.dev.devmodels import ensure_tiny_model, ensure_tokenizer


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir() -> Path:
    return ensure_tokenizer("qwen3")


@pytest.fixture(scope="session")
def llama3_tokenizer_dir() -> Path:
    return ensure_tokenizer("llama3")


@pytest.fixture(scope="session")
def qwen3_hf_tokenizer(qwen3_tokenizer_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen3_tokenizer_dir)


@pytest.fixture(scope="session")
def llama3_hf_tokenizer(llama3_tokenizer_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(llama3_tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    pytest.importorskip("torch", reason="the tiny model needs torch (the 'model' extra)")
    return ensure_tiny_model("qwen3")


@pytest.fixture
def llm_server() -> Iterator[Callable[..., Any]]:
    from prorl_celery.dev.llm_server import BackgroundServer, create_llm_app

    started: list[Any] = []

    def start(engine: Any, **app_kwargs: Any) -> Any:
        server = BackgroundServer(create_llm_app(engine, **app_kwargs)).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def scripted_llm_server(llm_server: Callable[..., Any], qwen3_hf_tokenizer: Any,
                        llama3_hf_tokenizer: Any) -> Callable[..., Any]:
    from prorl_celery.dev.llm_server import ScriptedEngine

    tokenizers = {"qwen3": qwen3_hf_tokenizer, "llama3": llama3_hf_tokenizer}

    def start(rules: Any = (), tokenizer: Any = "qwen3", **engine_kwargs: Any) -> Any:
        engine = ScriptedEngine(tokenizers.get(tokenizer, tokenizer), rules, **engine_kwargs)
        return llm_server(engine)

    return start
