"""Task handlers: the ``AgentHandler`` plug-in interface and the registry of task names.

The task families themselves (``handlers.math``, ``handlers.noop``, ...) are imported on
demand by the registry, so importing this package stays cheap.
"""
from handlers.base import (
    AgentHandler,
    ChatLLM,
    EndpointRequest,
    EvalResult,
    Generation,
    JobContext,
    JobEndpoint,
    SandboxRequest,
)
from handlers.registry import (
    UnknownTask,
    clear_cache,
    get_handler,
    load_handlers,
    registered_tasks,
)

__all__ = [
    "AgentHandler",
    "ChatLLM",
    "EndpointRequest",
    "EvalResult",
    "Generation",
    "JobContext",
    "JobEndpoint",
    "SandboxRequest",
    "UnknownTask",
    "clear_cache",
    "get_handler",
    "load_handlers",
    "registered_tasks",
]
