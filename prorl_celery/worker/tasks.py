"""The three stage tasks. Thin on purpose: all logic is in :mod:`prorl_celery.worker.pipeline`.

INIT and EVAL run on the Celery thread that picked them up. A RUN task only admits its stage:
it takes a slot of the process's stage loop (:class:`prorl_celery.core.event_loops.StageLoop`), claims the
job and returns, while the stage runs on that shared loop; so a RUN worker's ``-c`` threads only
admit stages, and its slots (``PRORL_RUN_SLOTS``, by default ``-c``) are how many run at once.
"""
from __future__ import annotations

from celery import Task
from celery.exceptions import Reject

from prorl_celery.celery_app import Payload, app, enqueue
from prorl_celery.core.event_loops import StageClosed, stage_loop
from prorl_celery.core.status import Stage
from prorl_celery.services import get_services
from prorl_celery.worker.pipeline import begin_stage, begin_stages, execute_stage


@app.task(name="prorl.init")
def init_stage(job_ids: Payload) -> None:
    execute_stage(Stage.INIT, job_ids)


# acked once it returns, that is once the job is claimed: a message whose worker dies while it
# waits for a slot goes back to the queue (after the visibility timeout), and a copy of one
# that was claimed is a no-op through the claim; the running stage is covered by its lease
@app.task(name="prorl.run", acks_late=True, bind=True)
def run_stage(self: Task, job_ids: Payload) -> None:
    services = get_services()
    loop = stage_loop(services.settings.run_slots or 64)
    try:
        if isinstance(job_ids, str):
            loop.admit(lambda loop: begin_stage(Stage.RUN, job_ids, services, loop))
            return
        taken = loop.admit_many(len(job_ids), lambda loop, n: begin_stages(Stage.RUN, job_ids[:n], services, loop))
    except StageClosed:  # shutting down before it was claimed: another worker will run it
        raise Reject("worker shutting down", requeue=True) from None
    if taken < len(job_ids):
        # the stages this worker has no slot for go back as one message, to whichever RUN
        # worker (this one included) has a slot first; its own queue: run.<node> stays local
        queue = (self.request.delivery_info or {}).get("routing_key") or Stage.RUN.value
        rest = job_ids[taken:]
        try:
            enqueue(Stage.RUN, rest[0] if len(rest) == 1 else rest, queue=queue)
        except Exception as error:  # the broker stayed away: the whole message again (claimed ones are no-ops)
            raise Reject(f"cannot hand on RUN stages: {error}", requeue=True) from error


@app.task(name="prorl.eval")
def eval_stage(job_ids: Payload) -> None:
    execute_stage(Stage.EVAL, job_ids)
