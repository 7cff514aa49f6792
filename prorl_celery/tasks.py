"""The three stage tasks. Thin on purpose: all logic is in :mod:`prorl_celery.pipeline`."""
from __future__ import annotations

from .celery_app import app
from .pipeline import execute_stage
from .status import Stage


@app.task(name="prorl.init")
def init_stage(job_id: str) -> None:
    execute_stage(Stage.INIT, job_id)


@app.task(name="prorl.run")
def run_stage(job_id: str) -> None:
    execute_stage(Stage.RUN, job_id)


@app.task(name="prorl.eval")
def eval_stage(job_id: str) -> None:
    execute_stage(Stage.EVAL, job_id)
