"""HTTP face of the emulator (aiohttp): vLLM's OpenAI endpoints, the PD KV handshake, metrics and fault switches.

Endpoints: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, /health, /metrics, /version;
internal: POST /internal/kv/pull (a decode instance pulls a finished prefill's KV blocks), GET|POST /internal/faults,
GET /internal/state.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from pdfleet import __version__
from pdfleet.engine import protocol, tokens
from pdfleet.engine.config import EngineSettings
from pdfleet.engine.kvcache import KvBlockPool
from pdfleet.engine.metrics import CONTENT_TYPE, EngineMetrics
from pdfleet.engine.scheduler import Scheduler, Sequence
from pdfleet.perfmodel import presets
from pdfleet.perfmodel.timing import (
    Hardware,
    effective_max_model_len,
    kv_bytes_per_token,
    kv_capacity_tokens,
    kv_transfer_time,
    transfer_link,
)

log = logging.getLogger("pdfleet.engine")

VLLM_VERSION = "0.32.0"  # the vLLM release whose wire format the emulator follows
KV_PULL_TIMEOUT_S = 10.0
CRASH_EXIT_CODE = 70
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


class RequestError(Exception):
    """A request the engine refuses; becomes a vLLM-style JSON error."""

    def __init__(self, status: int, message: str, error_type: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type


class KvPullError(Exception):
    """A KV pull that failed; `reason` is a pdfleet_engine_kv_transfer_failures_total label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class GenerationRequest:
    """A validated /v1/completions or /v1/chat/completions request."""

    kind: str
    request_id: str
    model: str
    prompt_tokens: int
    output_tokens: int
    finish_reason: str
    stream: bool
    include_usage: bool
    kv_transfer_params: dict
    internal_id: str = ""  # the engine's own id (vLLM: the response id plus a random suffix); names held KV blocks


def flat_block_ids(groups: Any) -> list[int]:
    """remote_block_ids as one list: vLLM 0.32 sends a list per KV cache group (`[[1, 2]]`); a flat list is accepted.

    Raises TypeError for anything but a list of ints or of lists of ints."""
    if not isinstance(groups, list):
        raise TypeError("remote_block_ids must be a list")
    flat: list[int] = []
    for item in groups:
        items = item if isinstance(item, list) else [item]
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in items):
            raise TypeError("remote_block_ids must hold block ids (ints)")
        flat.extend(items)
    return flat


def error_response(status: int, message: str, error_type: str) -> web.Response:
    """A JSON error body as vLLM returns it."""
    return web.Response(
        body=protocol.to_json(protocol.error_body(message, error_type, status)),
        status=status,
        content_type="application/json",
    )


def json_response(body: Any, status: int = 200) -> web.Response:
    """Compact JSON response."""
    return web.Response(body=protocol.to_json(body), status=status, content_type="application/json")


def engine_limits(settings: EngineSettings) -> tuple[Hardware, int, int]:
    """Hardware, KV capacity in blocks and effective max_model_len; raises ValueError when the model does not fit."""
    hw = Hardware(
        presets.model_preset(settings.model_preset),
        presets.gpu_preset(settings.gpu_preset),
        settings.tensor_parallel_size,
        settings.kv_cache_dtype,
    )
    capacity = kv_capacity_tokens(hw, settings.gpu_memory_utilization)
    if capacity < settings.block_size:
        raise ValueError(
            f"no memory left for the KV cache: {hw.model.name} on {settings.tensor_parallel_size} x "
            f"{hw.gpu.name} at gpu_memory_utilization {settings.gpu_memory_utilization}"
        )
    return hw, capacity // settings.block_size, effective_max_model_len(hw.model, capacity, settings.max_model_len)


class EngineServer:
    """One emulated engine: settings, KV ledger, scheduler task and the aiohttp application."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.faults = settings.faults
        self.hw, capacity_blocks, self.max_model_len = engine_limits(settings)
        self.kv_bytes_per_token = kv_bytes_per_token(self.hw.model, settings.kv_cache_dtype)
        self.metrics = EngineMetrics(settings.served_model_name, self.max_model_len, nixl=settings.nixl)
        self.pool = KvBlockPool(capacity_blocks, settings.block_size, on_expire=self.metrics.kv_expired)
        self.intra_rack = presets.interconnect_preset(settings.intra_rack_link)
        self.cross_rack = presets.interconnect_preset(settings.cross_rack_link)
        self.created = int(time.time())
        self.fingerprint = protocol.system_fingerprint(VLLM_VERSION, uuid.uuid4().hex)
        self.scheduler: Scheduler | None = None
        self.inflight = 0
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task | None = None
        self._unhang = asyncio.Event()
        self.app = web.Application(client_max_size=64 * 1024**2)
        self.app.add_routes(
            [
                web.post("/v1/completions", self.completions),
                web.post("/v1/chat/completions", self.chat_completions),
                web.get("/v1/models", self.models),
                web.get("/health", self.health),
                web.get("/metrics", self.prometheus),
                web.get("/version", self.version),
                web.post("/internal/kv/pull", self.kv_pull),
                web.get("/internal/faults", self.get_faults),
                web.post("/internal/faults", self.set_faults),
                web.get("/internal/state", self.state),
            ]
        )
        self.app.on_startup.append(self._start)
        self.app.on_cleanup.append(self._stop)

    async def _start(self, _app: web.Application) -> None:
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        if not self.settings.zero_delay:
            self.scheduler = Scheduler(
                self.hw,
                self.pool,
                self.metrics,
                self.faults,
                max_num_seqs=self.settings.max_num_seqs,
                max_num_batched_tokens=self.settings.max_num_batched_tokens,
                speedup=self.settings.speedup,
                kv_hold_ttl_s=self.settings.kv_hold_ttl_s,
            )
            self._task = asyncio.create_task(self.scheduler.run())
        self._publish_state()

    async def _stop(self, _app: web.Application) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._session:
            await self._session.close()

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _publish_state(self) -> None:
        if self.scheduler:
            self.scheduler.publish_state()
        else:
            self.metrics.scheduler_state(self.inflight, 0, self.pool.usage)

    # --- plain endpoints -------------------------------------------------------------------------------------------

    async def health(self, _request: web.Request) -> web.Response:
        """200 with an empty body, like vLLM; 503 when the unhealthy fault is on."""
        return web.Response(status=503 if self.faults.unhealthy else 200)

    async def version(self, _request: web.Request) -> web.Response:
        """vLLM's /version, plus which emulator answers."""
        return json_response({"version": VLLM_VERSION, "emulator": f"pdfleet {__version__}"})

    async def models(self, _request: web.Request) -> web.Response:
        """The served model names."""
        return json_response(
            protocol.models_body(
                self.settings.served_model_names, self.settings.model, self.max_model_len, self.created
            )
        )

    async def prometheus(self, _request: web.Request) -> web.Response:
        """Prometheus exposition of the vLLM and KV transfer series."""
        self.pool.expire(self._now())  # an idle engine has no step to expire held KV blocks
        self._publish_state()
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    async def state(self, _request: web.Request) -> web.Response:
        """Role, rack and scheduler state, for tests and debugging."""
        sched = self.scheduler
        return json_response(
            {
                "role": self.settings.role,
                "rack": self.settings.rack,
                "engine_id": self.settings.engine_id,
                "model_preset": self.hw.model.name,
                "gpu_preset": self.hw.gpu.name,
                "zero_delay": self.settings.zero_delay,
                "running": len(sched.running) if sched else self.inflight,
                "waiting": len(sched.waiting) + sched.pulling if sched else 0,
                "kv_capacity_blocks": self.pool.capacity_blocks,
                "kv_used_blocks": self.pool.used_blocks,
                "kv_held_requests": self.pool.held_requests,
                "max_model_len": self.max_model_len,
            }
        )

    async def get_faults(self, _request: web.Request) -> web.Response:
        """Current fault switches."""
        return json_response(self.faults.as_dict())

    async def set_faults(self, request: web.Request) -> web.Response:
        """Change fault switches with a partial JSON object; switching hang off releases hung requests."""
        try:
            changes = await request.json()
            if not isinstance(changes, dict):
                raise ValueError("body must be a JSON object")
            self.faults.update(changes)
        except ValueError as exc:
            return error_response(400, str(exc), "BadRequestError")
        if not self.faults.hang:
            self._unhang.set()
            self._unhang = asyncio.Event()
        log.warning("faults now %s", self.faults.as_dict())
        return json_response(self.faults.as_dict())

    # --- KV transfer -----------------------------------------------------------------------------------------------

    async def kv_pull(self, request: web.Request) -> web.Response:
        """Prefill side of a pull: hand over the held blocks' metadata and byte count, and free them."""
        try:
            body = await request.json()
            request_id, block_ids = body["remote_request_id"], flat_block_ids(body["remote_block_ids"])
        except (ValueError, KeyError, TypeError) as exc:
            return error_response(400, f"bad KV pull request: {exc}", "BadRequestError")
        if self.faults.take_kv_source_failure():
            return error_response(500, "injected KV source failure", "InternalServerError")
        engine_id = body.get("remote_engine_id")
        if engine_id and engine_id != self.settings.engine_id:
            return error_response(
                404, f"engine {engine_id} is not this engine ({self.settings.engine_id})", "NotFoundError"
            )
        self.pool.expire(self._now())
        held = self.pool.take(request_id, block_ids)
        if held is None and (held := self.pool.released(request_id, block_ids)) is not None:
            # vLLM's NIXL producer cannot refuse a read: the decode reads the blocks whatever they hold now, and the
            # prefill only learns of it from the completion notification ("Potentially invalid KV blocks for
            # unrecognized request ... They may have expired."), counted in vllm:nixl_num_notifications_after_expiry
            log.error(
                "Potentially invalid KV blocks for unrecognized request %s were retrieved by a decode worker. "
                "They may have expired.",
                request_id,
            )
            self.metrics.kv_read_after_expiry()
        if held is None:
            return error_response(
                404, f"no KV blocks held for request {request_id} with the given block ids", "NotFoundError"
            )
        if self.scheduler:
            self.scheduler.wake()
        return json_response(
            {
                "request_id": held.request_id,
                "engine_id": self.settings.engine_id,
                "block_ids": held.block_ids,
                "block_size": self.settings.block_size,
                "num_tokens": held.num_tokens,
                "num_bytes": held.num_tokens * self.kv_bytes_per_token,
                "kv_cache_dtype": self.settings.kv_cache_dtype,
                "tp_size": self.settings.tensor_parallel_size,
                "rack": self.settings.rack,
            }
        )

    async def _pull_kv(self, params: dict, request_id: str) -> int:
        """Decode side: pull the KV a prefill holds for this request; returns the number of prompt tokens received."""
        try:
            block_ids = flat_block_ids(params.get("remote_block_ids") or [])
        except (TypeError, ValueError) as exc:
            raise KvPullError("unknown_blocks", f"bad remote_block_ids: {exc}") from exc
        if not block_ids:
            return 0
        if self.faults.take_kv_pull_failure():
            raise KvPullError("injected", "injected KV pull failure")
        host, port = params.get("remote_host"), params.get("remote_port")
        if not host or not port:
            raise KvPullError("unknown_blocks", "kv_transfer_params lack remote_host/remote_port")
        url = f"http://{f'[{host}]' if ':' in str(host) else host}:{port}/internal/kv/pull"
        body = {
            "remote_request_id": params.get("remote_request_id"),
            "remote_engine_id": params.get("remote_engine_id"),
            "remote_block_ids": [block_ids],
            "request_id": request_id,
            "puller_engine_id": self.settings.engine_id,
            "puller_rack": self.settings.rack,
        }
        start = self._now()
        assert self._session is not None
        try:
            async with self._session.post(
                url,
                data=protocol.to_json(body),
                headers={"Content-Type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=KV_PULL_TIMEOUT_S),
            ) as resp:
                status, answer = resp.status, await resp.json(content_type=None)
            posted = self._now()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
            raise KvPullError("unreachable", f"prefill {host}:{port} unreachable: {exc!r}") from exc
        if status != 200:
            detail = answer.get("error", {}).get("message") if isinstance(answer, dict) else answer
            reason = "unknown_blocks" if status == 404 else "source_error"
            raise KvPullError(reason, f"prefill {host}:{port} answered {status}: {detail}")
        num_bytes, src_rack = int(answer["num_bytes"]), answer.get("rack", "")
        same_rack = bool(src_rack) and src_rack == self.settings.rack
        if not self.settings.zero_delay:
            link = transfer_link(src_rack, self.settings.rack, self.intra_rack, self.cross_rack)
            nics = min(int(answer.get("tp_size", 1)), self.settings.tensor_parallel_size)
            await asyncio.sleep(kv_transfer_time(num_bytes, link, nics) * self.faults.slowdown / self.settings.speedup)
        # one descriptor per layer for a contiguous run of blocks (what vLLM's NIXL reader posts for its layout)
        self.metrics.kv_transfer(self._now() - start, num_bytes, same_rack, posted - start, self.hw.model.layers)
        return int(answer["num_tokens"])

    def _kv_params_out(self, internal_id: str, block_ids: list[int], num_tokens: int) -> dict:
        """kv_transfer_params a prefill returns for the decode side: vLLM 0.32's NixlConnector (pull mode) fields, in
        its order, plus our `remote_rack`. remote_port is this server's HTTP port (the emulator's side channel)."""
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [block_ids],  # one list per KV cache group; a plain decoder has one group
            "remote_engine_id": self.settings.engine_id,
            "remote_request_id": internal_id,
            "remote_host": self.settings.advertise_host,
            "remote_port": self.settings.port,
            "tp_size": self.settings.tensor_parallel_size,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": num_tokens if block_ids else 0,
            "remote_blocks_expiry_time": None,
            "transfer_mode": "pull",
            "remote_prefill_cached_tokens": 0,
            "remote_rack": self.settings.rack,
        }

    # --- generation ------------------------------------------------------------------------------------------------

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/completions."""
        return await self._generate("completion", request)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/chat/completions."""
        return await self._generate("chat", request)

    def _parse(self, kind: str, body: Any, header_id: str | None) -> GenerationRequest:
        if not isinstance(body, dict):
            raise RequestError(400, "request body must be a JSON object", "BadRequestError")
        model = body.get("model") or self.settings.served_model_name
        if model not in self.settings.served_model_names and model != self.settings.model:
            raise RequestError(404, f"The model `{model}` does not exist.", "NotFoundError")
        if body.get("n", 1) != 1:
            raise RequestError(400, "the emulator serves n=1 only", "BadRequestError")
        try:
            prompt = (
                tokens.chat_prompt_tokens(body.get("messages"))
                if kind == "chat"
                else tokens.prompt_tokens(body.get("prompt"))
            )
        except ValueError as exc:
            raise RequestError(400, str(exc), "BadRequestError") from exc
        if prompt < 1:
            raise RequestError(400, "the prompt is empty", "BadRequestError")
        if prompt > self.max_model_len:
            raise RequestError(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your request has {prompt} input tokens.",
                "BadRequestError",
            )
        default_max = 16 if kind == "completion" else self.max_model_len - prompt
        max_tokens = body.get("max_completion_tokens") if kind == "chat" else None
        max_tokens = max_tokens if max_tokens is not None else body.get("max_tokens")
        max_tokens = default_max if max_tokens is None else max_tokens
        min_tokens = body.get("min_tokens") or 0
        if not isinstance(max_tokens, int) or max_tokens < 1 or not isinstance(min_tokens, int) or min_tokens < 0:
            raise RequestError(
                400, "max_tokens must be an integer >= 1 and min_tokens an integer >= 0", "BadRequestError"
            )
        if prompt + max_tokens > self.max_model_len:
            raise RequestError(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {prompt + max_tokens} tokens ({prompt} in the input, "
                f"{max_tokens} in the completion). Please reduce the length of the input or "
                f"completion.",
                "BadRequestError",
            )
        output, finish_reason = tokens.plan_output(
            max_tokens, min(min_tokens, max_tokens), bool(body.get("ignore_eos")), self.settings.natural_output_tokens
        )
        stream = bool(body.get("stream"))
        stream_options = body.get("stream_options") or {}
        kv_params = body.get("kv_transfer_params") or {}
        if not isinstance(kv_params, dict):
            raise RequestError(400, "kv_transfer_params must be an object", "BadRequestError")
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        request_id = prefix + (header_id or uuid.uuid4().hex[:16])
        # vLLM's internal request id: completions add the prompt index, both a random suffix (so a reused
        # X-Request-Id never names another request's KV blocks)
        internal_id = f"{request_id}{'' if kind == 'chat' else '-0'}-{uuid.uuid4().hex[:8]}"
        return GenerationRequest(
            kind,
            request_id,
            model,
            prompt,
            output,
            finish_reason,
            stream,
            stream and bool(stream_options.get("include_usage")),
            kv_params,
            internal_id,
        )

    async def _generate(self, kind: str, request: web.Request) -> web.StreamResponse:
        if request.content_type != "application/json":  # vLLM validates the media type before the body
            return error_response(400, "Unsupported Media Type: Only 'application/json' is allowed", "Bad Request")
        try:
            body = await request.json()
        except ValueError:
            return error_response(400, "request body is not valid JSON", "BadRequestError")
        try:
            req = self._parse(kind, body, request.headers.get("X-Request-Id"))
        except RequestError as exc:
            return error_response(exc.status, str(exc), exc.error_type)
        while self.faults.hang:
            await self._unhang.wait()
        arrival = self._now()
        self.inflight += 1
        try:
            computed = await self._remote_prefill(req)
            if self.scheduler:
                return await self._run_scheduled(request, req, arrival, computed)
            return await self._run_immediate(request, req, arrival)
        except KvPullError as exc:
            return error_response(500, f"KV transfer failed: {exc}", "InternalServerError")
        finally:
            self.inflight -= 1

    async def _remote_prefill(self, req: GenerationRequest) -> int:
        """Pull remote KV when the request says so; returns prompt tokens not to recompute (at most prompt - 1)."""
        if not req.kv_transfer_params.get("do_remote_prefill"):
            return 0
        sched = self.scheduler
        if sched:
            sched.pulling += 1
            sched.publish_state()
        try:
            received = await self._pull_kv(req.kv_transfer_params, req.request_id)
        except KvPullError as exc:
            self.metrics.kv_transfer_failed(exc.reason)
            log.warning("KV pull for %s failed (%s): %s", req.request_id, exc.reason, exc)
            if self.settings.kv_load_failure_policy != "recompute":
                self.metrics.success["error"].inc()
                raise
            received = 0
        finally:
            if sched:
                sched.pulling -= 1
        # vLLM recomputes the last prompt token on the decode side to sample the first new token
        return min(received, req.prompt_tokens - 1)

    async def _run_scheduled(
        self, request: web.Request, req: GenerationRequest, arrival: float, computed: int
    ) -> web.StreamResponse:
        assert self.scheduler is not None
        seq = Sequence(
            req.internal_id,
            req.prompt_tokens,
            req.output_tokens,
            req.finish_reason,
            arrival,
            computed_tokens=computed,
            hold_kv=bool(req.kv_transfer_params.get("do_remote_decode")),
        )
        self.scheduler.submit(seq)

        async def batches() -> AsyncIterator[int]:
            while count := await seq.read():
                yield count

        try:
            return await self._respond(request, req, batches(), lambda: seq.held_block_ids)
        finally:
            self.scheduler.abort(seq)

    async def _run_immediate(self, request: web.Request, req: GenerationRequest, arrival: float) -> web.StreamResponse:
        """Zero-delay mode: no step loop; all tokens exist at once and metrics record the (tiny) real latencies."""
        held: list[int] = []
        self.pool.expire(arrival)
        if req.kv_transfer_params.get("do_remote_decode"):
            held = self.pool.hold(req.internal_id, req.prompt_tokens, arrival, self.settings.kv_hold_ttl_s)
        now = self._now()
        self.metrics.first_token(now - arrival, 0.0, req.prompt_tokens)
        self.metrics.generation_tokens.inc(req.output_tokens - 1)
        self.metrics.finished(req.finish_reason, now - arrival, 0.0, req.output_tokens, req.prompt_tokens)
        self.metrics.scheduler_state(self.inflight, 0, self.pool.usage)

        async def batches() -> AsyncIterator[int]:
            yield req.output_tokens

        return await self._respond(request, req, batches(), lambda: held)

    def _crash_if_due(self, produced: int) -> None:
        limit = self.faults.crash_after_tokens
        if limit is not None and produced >= limit:
            log.error("crash fault: exiting after %d tokens", produced)
            os._exit(CRASH_EXIT_CODE)

    def _tokens_before_crash(self, produced: int, count: int) -> int:
        limit = self.faults.crash_after_tokens
        return count if limit is None else max(0, min(count, limit - produced))

    async def _respond(
        self,
        request: web.Request,
        req: GenerationRequest,
        batches: AsyncIterator[int],
        held_block_ids: Callable[[], list[int]],
    ) -> web.StreamResponse:
        if req.stream:
            return await self._stream(request, req, batches)
        produced = 0
        async for count in batches:
            produced += count
            self._crash_if_due(produced)
        if produced < req.output_tokens:
            return error_response(500, "request aborted", "InternalServerError")
        kv_out = (
            self._kv_params_out(req.internal_id, held_block_ids(), req.prompt_tokens)
            if req.kv_transfer_params.get("do_remote_decode")
            else None
        )
        return json_response(
            protocol.full_response(
                req.kind,
                req.request_id,
                self.created,
                req.model,
                tokens.generated_text(0, produced),
                req.finish_reason,
                None,
                req.prompt_tokens,
                produced,
                kv_out,
                self.fingerprint,
            )
        )

    async def _stream(
        self, request: web.Request, req: GenerationRequest, batches: AsyncIterator[int]
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)
        head = (
            [protocol.sse_event(protocol.chat_role_chunk(req.request_id, self.created, req.model))]
            if req.kind == "chat"
            else []
        )
        last = req.output_tokens - 1
        produced = 0
        async for count in batches:
            allowed = self._tokens_before_crash(produced, count)
            chunks = head + [
                protocol.sse_event(
                    protocol.stream_chunk(
                        req.kind,
                        req.request_id,
                        self.created,
                        req.model,
                        tokens.token_text(i),
                        req.finish_reason if i == last else None,
                    )
                )
                for i in range(produced, produced + allowed)
            ]
            head = []
            produced += allowed
            if produced >= req.output_tokens:
                if req.include_usage:
                    chunks.append(
                        protocol.sse_event(
                            protocol.usage_chunk(
                                req.kind,
                                req.request_id,
                                self.created,
                                req.model,
                                req.prompt_tokens,
                                produced,
                                self.fingerprint,
                            )
                        )
                    )
                chunks.append(protocol.SSE_DONE)
            await response.write(b"".join(chunks))
            self._crash_if_due(produced)
        await response.write_eof()
        return response


async def serve(
    settings: EngineSettings, ready: asyncio.Event | None = None, stop: asyncio.Event | None = None
) -> None:
    """Run the emulator until `stop` is set (or forever)."""
    server = EngineServer(settings)
    # handler_cancellation: a client that disconnects cancels its handler, so its request is aborted in the engine
    # (streamed or not), as vLLM's server does
    runner = web.AppRunner(server.app, access_log=None, handle_signals=False, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, backlog=4096, reuse_address=True)
    await site.start()
    log.info(
        "engine emulator serving %s (%s on %d x %s, role %s, rack %r, %s) on %s:%d",
        settings.served_model_name,
        server.hw.model.name,
        settings.tensor_parallel_size,
        server.hw.gpu.name,
        settings.role,
        settings.rack,
        "zero-delay" if settings.zero_delay else f"speedup {settings.speedup:g}",
        settings.host,
        settings.port,
    )
    if ready:
        ready.set()
    try:
        await (stop or asyncio.Event()).wait()
    finally:
        await runner.cleanup()
