"""Trainer integrations: adapters at the edge (design decision 12).

- :mod:`prorl_celery.trainer.integrations.trl`: a TRL ``GRPOTrainer`` ``rollout_func`` (extra ``trl``);
- :mod:`prorl_celery.trainer.integrations.verl`: a verl agent loop registered as ``prorl`` (verl lives in
  a venv of its own: ``scripts/install_verl.sh``);
- ``vllm_ext/prorl_vllm_worker.py``: the vLLM worker extension weight updates use on vLLM's CPU
  build (loaded by vLLM, never imported here).

Nothing in the service core imports these modules, and these modules import their trainer only
where they are used.
"""
