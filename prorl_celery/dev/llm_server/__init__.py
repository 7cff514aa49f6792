"""HTTP LLM servers speaking the real protocols (vLLM, SGLang, llama.cpp) for tests and benches.

    from prorl_celery.dev.llm_server import BackgroundServer, ScriptedEngine, create_llm_app

    engine = ScriptedEngine("qwen3", [{"match": r"2\\+2", "replies": ["<think>easy</think>4"]}])
    with BackgroundServer(create_llm_app(engine)) as server:
        ...  # POST server.url + "/v1/completions"

Names resolve lazily so that ``prorl --help`` works without fastapi or torch installed.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "create_llm_app": "app", "LLMServer": "app",
    "ScriptedEngine": "engines", "TorchEngine": "engines", "SamplingParams": "engines",
    "Step": "engines", "Rule": "engines", "load_rules": "engines", "load_tokenizer": "engines",
    "BackgroundServer": "cli", "build_engine": "cli", "llm_serve": "cli",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
