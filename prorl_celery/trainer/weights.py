"""Loading new policy weights into running vLLM servers without losing in-flight rollouts.

The trainer saves its weights to a directory the vLLM servers can read (``save_pretrained``,
safetensors) and calls :meth:`VLLMWeightSync.update`. For every server, with vLLM's RL routes
(``VLLM_SERVER_DEV_MODE=1``):

1. ``POST /pause?mode=keep``: generation stops between engine steps; requests in flight stay
   (their KV cache too), nothing is aborted;
2. ``POST /collective_rpc`` ``prorl_reload_weights`` (our worker extension, which
   :mod:`prorl_celery.dev.vllmcpu` starts vLLM with) or, on a server without it, vLLM's own
   ``reload_weights``, with ``weights_path``: the workers load the directory in place. On vLLM's
   CPU backend the plain ``reload_weights`` leaves the tied LM head computing with the old
   weights (its oneDNN handle is built once from them); the extension rebuilds it, so tokens
   after the update are exactly the new policy's (see
   ``prorl_celery/trainer/integrations/vllm_ext/prorl_vllm_worker.py``);
3. ``POST /reset_prefix_cache?reset_running_requests=true``: the KV cache of every cached prefix
   and of the requests in flight was computed by the old weights; the requests in flight are
   preempted and recompute their context with the new ones, so every token generated after the
   update is exactly the new policy's (``recompute_in_flight=False`` skips this: faster, but
   tokens after the update then attend to old-policy keys and values);
   ``POST /update_weight_version``: vLLM's own record of the version;
4. the gateway's ``POST /llm_servers/version``: from now on every turn records the new version,
   and a turn that was in flight records both (``spans_update``);
5. ``POST /resume`` (always, even when a step failed, so a failed update never leaves a server
   paused).

Only httpx is imported: trainers use this without the service's server-side dependencies.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx


class WeightSyncError(RuntimeError):
    """A step of the update failed; the message names the server and the step."""


@dataclass(frozen=True)
class WeightUpdate:
    version: int
    servers: list[str]
    #: seconds generation was paused (first pause to last resume), and of those the reload
    paused_s: float
    reload_s: float
    steps: dict[str, float] = field(default_factory=dict)
    #: the collective_rpc method each server reloaded with (``prorl_reload_weights`` or
    #: ``reload_weights``)
    methods: dict[str, str] = field(default_factory=dict)


def server_base(address: str) -> str:
    """``http://host:port/v1`` and ``http://host:port`` name the same vLLM server."""
    address = address.rstrip("/")
    return address[: -len("/v1")] if address.endswith("/v1") else address


class VLLMWeightSync:
    """Pushes weights to vLLM servers and tells the gateway which policy version they serve."""

    #: tried first; a server without the worker extension answers that it has no such method
    EXTENSION_METHOD = "prorl_reload_weights"

    def __init__(self, gateway_url: str, *, token: str | None = None, timeout_s: float = 600.0,
                 reload_method: str | None = None) -> None:
        """``reload_method``: the collective_rpc method to reload with; default: the worker
        extension's ``prorl_reload_weights`` where the server has it, else ``reload_weights``."""
        self.reload_method = reload_method
        self._methods: dict[str, str] = {}
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.gateway = httpx.Client(base_url=gateway_url.rstrip("/"), headers=headers, timeout=timeout_s)
        self.http = httpx.Client(timeout=timeout_s)

    def __enter__(self) -> VLLMWeightSync:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.gateway.close()
        self.http.close()

    def update(self, servers: Sequence[str], weights_dir: str, version: int, *,
               recompute_in_flight: bool = True) -> WeightUpdate:
        """Load ``weights_dir`` into every server as policy ``version`` (all paused together,
        so no server runs the new policy while another still runs the old one)."""
        bases = [server_base(s) for s in servers]
        steps: dict[str, float] = {}
        paused: list[str] = []
        started = time.monotonic()
        try:
            for base in bases:
                self._post(base, "/pause", "pause", params={"mode": "keep"})
                paused.append(base)
            steps["pause"] = time.monotonic() - started
            reload_started = time.monotonic()
            for base in bases:
                self._reload(base, str(weights_dir))
                if recompute_in_flight:
                    reply = self._post(base, "/reset_prefix_cache", "reset_prefix_cache",
                                       params={"reset_running_requests": "true"})
                    if not reply.json().get("success"):
                        raise WeightSyncError(f"{base}: reset_prefix_cache did not succeed: {reply.text[:300]}")
                self._post(base, "/update_weight_version", "update_weight_version",
                           json={"new_version": str(version)})
            reload_s = time.monotonic() - reload_started
            for address in servers:
                reply = self.gateway.post("/llm_servers/version", json={"version": version, "address": address})
                if reply.status_code != 200:
                    raise WeightSyncError(f"gateway: setting version {version} of {address} answered "
                                          f"{reply.status_code}: {reply.text[:300]}")
        finally:
            resume_started = time.monotonic()
            failures = []
            for base in paused:
                try:
                    self._post(base, "/resume", "resume")
                except WeightSyncError as error:
                    failures.append(str(error))
            steps["resume"] = time.monotonic() - resume_started
            if failures:
                raise WeightSyncError("; ".join(failures))
        return WeightUpdate(version, list(servers), time.monotonic() - started, reload_s, steps,
                            {base: self._methods.get(base, "") for base in bases})

    def _reload(self, base: str, weights_dir: str) -> None:
        method = self.reload_method or self._methods.get(base) or self.EXTENSION_METHOD
        body = {"method": method, "kwargs": {"weights_path": weights_dir}}
        if method == self.EXTENSION_METHOD and self.reload_method is None and base not in self._methods:
            try:
                reply = self.http.post(base + "/collective_rpc", json=body)
            except httpx.HTTPError as error:
                raise WeightSyncError(f"{base}: reload_weights failed: {type(error).__name__}: {error}") from error
            if reply.status_code == 200:
                self._methods[base] = method
                return
            # a server started without the worker extension (vLLM answers 500 for a method its
            # workers lack); any other failure shows again in the plain reload below
            method = "reload_weights"
            body["method"] = method
        self._post(base, "/collective_rpc", method, json=body)
        self._methods[base] = method

    def _post(self, base: str, path: str, step: str, **request: object) -> httpx.Response:
        try:
            reply = self.http.post(base + path, **request)  # type: ignore[arg-type]
        except httpx.HTTPError as error:
            raise WeightSyncError(f"{base}: {step} failed: {type(error).__name__}: {error}") from error
        if reply.status_code != 200:
            hint = " (is the server running with VLLM_SERVER_DEV_MODE=1?)" if reply.status_code == 404 else ""
            raise WeightSyncError(f"{base}: {step} answered {reply.status_code}{hint}: {reply.text[:300]}")
        return reply
