"""The trainer-side SDK imports no server-side machinery, and the package has no import cycle
through the Celery app (run in fresh interpreters, as a trainer's process would)."""
from __future__ import annotations

import subprocess
import sys

SERVER_SIDE = ("celery", "kombu", "flask", "gunicorn", "transformers", "torch", "redis", "handlers")


def modules_after(code: str) -> list[str]:
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {SERVER_SIDE!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_trainer_sdk_loads_no_celery_flask_or_transformers():
    assert modules_after("import prorl_celery.client, prorl_celery.dapo, prorl_celery.assignment, "
                         "prorl_celery.weights, prorl_celery.submit") == []


def test_the_celery_app_is_found_where_celery_looks_and_loads_the_worker_signals_only_in_workers():
    loaded = modules_after(
        "import sys, prorl_celery\n"
        "from celery.app.utils import find_app\n"
        "assert find_app('prorl_celery') is prorl_celery.app  # what celery -A prorl_celery does\n"
        "assert 'prorl_celery.workers' not in sys.modules, 'worker signal handlers loaded outside a worker'\n"
        "assert 'prorl_celery.workers' in prorl_celery.app.conf.include  # a worker imports them")
    assert "celery" in loaded
