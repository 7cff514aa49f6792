"""The import rules between the project's folders, as one table, and what a trainer's process
loads (the SDK in fresh interpreters, as a trainer would import it).

``RULES`` is the layout's contract (DESIGN decision 20): each area may import itself and the
areas it lists, nothing else, with no exception list. The check reads every module's imports,
those inside functions included, from its source.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("prorl_celery", "handlers", "singularity", "api")
#: prorl_celery's folders; its root modules (celery_app, services, cli) are the wiring
FOLDERS = ("core", "state", "llm", "endpoint", "wire", "worker", "trainer", "dev")

#: area -> the other areas it may import
RULES: dict[str, set[str]] = {
    # the shared vocabulary: errors, status, outcomes, settings, event loops
    "core": set(),
    # everything in Redis
    "state": {"core"},
    # backends, pool, session, tokenizer (endpoint: the session's suffix_ids, until the
    # tokenizer owns that rule: issue 34, step 4)
    "llm": {"core", "state", "endpoint", "handlers", "singularity"},
    # the per-job endpoint: its app, dialects, history matcher, sample router
    # (handlers: Generation, EndpointRequest)
    "endpoint": {"core", "state", "llm", "handlers", "singularity"},
    # the gateway's intake and the result format (Celery publishing through the wiring)
    "wire": {"core", "state", "llm", "handlers", "wiring"},
    # stage tasks, the pipeline, worker signals, job sandboxes
    "worker": {"core", "state", "llm", "endpoint", "wire", "handlers", "singularity", "wiring"},
    # the trainer SDK: over HTTP, never the service (nor Celery, Flask or Redis: below)
    "trainer": {"core"},
    # dev tooling may use anything but the gateway's views
    "dev": {"core", "state", "llm", "endpoint", "wire", "worker", "trainer", "handlers", "singularity", "wiring"},
    # the wiring at prorl_celery's root: the Celery app, the services, the CLI
    "wiring": {"core", "state", "llm", "endpoint", "wire", "worker", "trainer", "dev", "handlers", "singularity"},
    # task plug-ins know the shared vocabulary and the sandbox, nothing of the service
    "handlers": {"core", "singularity"},
    "singularity": set(),
    # the gateway: never a worker's or dev tooling's modules
    "api": {"core", "state", "llm", "wire", "handlers", "wiring"},
}


def area_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "prorl_celery":
        return parts[1] if len(parts) > 1 and parts[1] in FOLDERS else "wiring"
    return parts[0] if parts[0] in PACKAGES else None


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports (relative ones resolved), at any depth of its code."""
    package = list(path.relative_to(ROOT).with_suffix("").parts)[:-1]  # a module's, or __init__'s own
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                found.add(".".join([*base, *([node.module] if node.module else [])]))
            elif node.module:
                found.add(node.module)
    return found


def project_modules() -> list[Path]:
    return [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
            if "handlers/swe/data" not in path.as_posix()]


def test_the_rules_table_names_every_area():
    assert set(RULES) == {*FOLDERS, "wiring", "handlers", "singularity", "api"}
    assert all(allowed <= set(RULES) for allowed in RULES.values())


def test_every_import_between_areas_follows_the_rules():
    broken = []
    for path in project_modules():
        parts = path.relative_to(ROOT).with_suffix("").parts
        here = area_of(".".join(parts))
        for module in sorted(imports_of(path)):
            there = area_of(module)
            if there is not None and there != here and there not in RULES[here]:
                broken.append(f"{path.relative_to(ROOT)} ({here}) imports {module} ({there})")
    assert not broken, "imports against tests/integration/test_imports.py's RULES:\n" + "\n".join(broken)


def test_the_check_sees_an_import_inside_a_function():
    """A rule check that misses function-level imports would pass on the back-edges it exists for."""
    probe = ROOT / "handlers" / "_probe_for_test_imports.py"
    probe.write_text("def late():\n    from prorl_celery.llm.session import TokenSession\n    return TokenSession\n")
    try:
        assert "prorl_celery.llm.session" in imports_of(probe)
        assert area_of("prorl_celery.llm.session") not in RULES["handlers"]
    finally:
        probe.unlink()


# -- what a trainer's process loads -------------------------------------------------------------

SERVER_SIDE = ("celery", "kombu", "flask", "gunicorn", "transformers", "torch", "redis", "handlers")


def modules_after(code: str) -> list[str]:
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {SERVER_SIDE!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_trainer_sdk_loads_no_celery_flask_or_transformers():
    assert modules_after("import prorl_celery.trainer, prorl_celery.trainer.submit") == []


def test_the_celery_app_is_found_where_celery_looks_and_loads_the_worker_signals_only_in_workers():
    loaded = modules_after(
        "import sys, prorl_celery\n"
        "from celery.app.utils import find_app\n"
        "assert find_app('prorl_celery') is prorl_celery.app  # what celery -A prorl_celery does\n"
        "assert 'prorl_celery.worker.signals' not in sys.modules, 'worker signal handlers loaded outside a worker'\n"
        "assert 'prorl_celery.worker.signals' in prorl_celery.app.conf.include  # a worker imports them")
    assert "celery" in loaded
