"""Task name -> handler class, from the setuptools entry point group ``prorl.handlers``.

A task family is registered by any installed distribution with, in its setup.cfg::

    [options.entry_points]
    prorl.handlers =
        math = handlers.math:MathHandler

The built-in handlers are also found from a source checkout that is not pip-installed (tests,
``PYTHONPATH=.``): entry points are merged over a built-in map, so an installed plug-in may
replace a built-in one. Lookups are cached per process; ``clear_cache`` forgets them.
"""
from __future__ import annotations

import functools
import importlib
import logging
import threading
from importlib.metadata import entry_points

from handlers.base import AgentHandler
from prorl_celery.core.errors import UnknownTask

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "prorl.handlers"

#: Handlers shipped with this package, as "module:attribute" like an entry point value.
BUILTIN_HANDLERS: dict[str, str] = {
    "agent": "handlers.agent_program:AgentProgramHandler",
    "code": "handlers.code:CodeHandler",
    "math": "handlers.math:MathHandler",
    "noop": "handlers.noop:NoopHandler",
    "stem": "handlers.stem:StemHandler",
    "swe": "handlers.swe:SweHandler",
}


_instances: dict[str, AgentHandler] = {}
_instances_lock = threading.Lock()
#: handlers named by configuration (PRORL_HANDLERS), as "name" -> "module:attribute"
_configured: dict[str, str] = {}
#: the handlers' own configuration, handed down by whoever starts the process (``configure``):
#: a handler reads it with ``option``, never the service's settings
_options: dict[str, str] = {}


def configure(spec: str, **options: str) -> None:
    """Set the handlers named by ``"name=module:Class,other=pkg.mod:Class"`` (PRORL_HANDLERS),
    and the handlers' ``options`` (``swe_repos``: PRORL_SWE_REPOS).

    For deployments and tests that load a handler module without installing a distribution;
    an empty spec removes them again.
    """
    _options.clear()
    _options.update(options)
    targets = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, target = item.partition("=")
        if not sep or ":" not in target:
            raise ValueError(f"handler spec {item!r} is not 'name=module:Class'")
        targets[name.strip()] = target.strip()
    if targets != _configured:
        _configured.clear()
        _configured.update(targets)
        clear_cache()


def option(name: str, default: str = "") -> str:
    """A handler option given to ``configure`` (``default`` when none was)."""
    return _options.get(name, default)


def load_handlers() -> dict[str, type[AgentHandler]]:
    """Every loadable handler class by task name (built-ins, overridden by entry points)."""
    return dict(_load()[0])


def registered_tasks() -> list[str]:
    """Sorted task names that have a loadable handler."""
    return sorted(_load()[0])


def get_handler(task: str) -> AgentHandler:
    """The process-wide handler instance for ``task``; raises UnknownTask (a KeyError)."""
    with _instances_lock:
        if task not in _instances:
            handlers, broken = _load()
            handler = handlers.get(task) or _by_alias(handlers, task)
            if handler is None:
                raise UnknownTask.naming(task, sorted(handlers), broken)
            _instances[task] = handler()
        return _instances[task]


def _by_alias(handlers: dict[str, type[AgentHandler]], task: str) -> type[AgentHandler] | None:
    return next((h for h in handlers.values() if task in h.aliases), None)


def clear_cache() -> None:
    """Forget loaded classes and instances (tests, or after installing a plug-in)."""
    with _instances_lock:
        _instances.clear()
        _load.cache_clear()


@functools.cache
def _load() -> tuple[dict[str, type[AgentHandler]], dict[str, str]]:
    """(handlers by task, load error by task); a broken plug-in must not hide the others."""
    handlers: dict[str, type[AgentHandler]] = {}
    broken: dict[str, str] = {}
    sources = [(name, target, "built-in") for name, target in BUILTIN_HANDLERS.items()]
    sources += [(ep.name, ep.value, "entry point") for ep in entry_points(group=ENTRY_POINT_GROUP)]
    sources += [(name, target, "PRORL_HANDLERS") for name, target in _configured.items()]
    for name, target, origin in sources:
        try:
            handler = _import_handler(target)
        except Exception as error:  # noqa: BLE001 - reported through UnknownTask and the log
            broken[name] = f"{target}: {type(error).__name__}: {error}"
            logger.error("cannot load %s handler %r (%s): %s", origin, name, target, error)
            continue
        if name in handlers and handlers[name] is not handler:
            logger.warning("task %r: %s %s replaces %r", name, origin, target, handlers[name])
        handlers[name] = handler
        broken.pop(name, None)
    return handlers, broken


def _import_handler(target: str) -> type[AgentHandler]:
    module_name, _, attribute = target.partition(":")
    obj = importlib.import_module(module_name.strip())
    for part in attribute.strip().split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, AgentHandler)):
        raise TypeError(f"{target} is not an AgentHandler subclass")
    return obj
