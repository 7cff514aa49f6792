"""What a Celery worker runs: the stage tasks, the pipeline, worker life-cycle signals,
job sandboxes and the readiness check.
"""
