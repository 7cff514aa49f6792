"""The three stage tasks. Thin on purpose: all logic is in :mod:`prorl_celery.pipeline`.

INIT and EVAL run on the Celery thread that picked them up. A RUN task only admits its stage:
it takes a slot of the process's stage loop (:class:`prorl_celery.event_loops.StageLoop`), claims the
job and returns, while the stage runs on that shared loop; so a RUN worker's ``-c`` threads only
admit stages, and its slots (``PRORL_RUN_SLOTS``, by default ``-c``) are how many run at once.
"""
from __future__ import annotations

from celery.exceptions import Reject

from .celery_app import app
from .event_loops import StageClosed, stage_loop
from .pipeline import begin_stage, execute_stage
from .services import get_services
from .status import Stage


@app.task(name="prorl.init")
def init_stage(job_id: str) -> None:
    execute_stage(Stage.INIT, job_id)


# acked once it returns, that is once the job is claimed: a message whose worker dies while it
# waits for a slot goes back to the queue (after the visibility timeout), and a copy of one
# that was claimed is a no-op through the claim; the running stage is covered by its lease
@app.task(name="prorl.run", acks_late=True)
def run_stage(job_id: str) -> None:
    services = get_services()
    try:
        stage_loop(services.settings.run_slots or 64).admit(
            lambda loop: begin_stage(Stage.RUN, job_id, services, loop))
    except StageClosed:  # shutting down before it was claimed: another worker will run it
        raise Reject("worker shutting down", requeue=True) from None


@app.task(name="prorl.eval")
def eval_stage(job_id: str) -> None:
    execute_stage(Stage.EVAL, job_id)
