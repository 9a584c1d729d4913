"""Prometheus metrics with vLLM 0.32's names, types, labels and bucket boundaries (vllm/v1/metrics/loggers.py and, for
the NIXL connector, vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py), plus the emulator's own KV transfer
series by rack locality (pdfleet_engine_kv_transfer_*; the KV transfer dashboard reads vLLM's vllm:nixl_* instead)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
TOKEN_LATENCY_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
# NixlPromMetrics: the transfer-time histogram drops the first post-time boundary (buckets[1:])
NIXL_POST_TIME_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_XFER_TIME_BUCKETS = NIXL_POST_TIME_BUCKETS[1:]
NIXL_BYTES_BUCKETS = tuple(float(2 ** (10 + i)) for i in range(1, 25, 2))  # 2 KiB .. 8 GiB
NIXL_DESCRIPTORS_BUCKETS = (10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000)


def request_tokens_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's per-request token-count buckets: 1, 2, 5 times the powers of ten up to max_model_len."""
    bounds: list[float] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_model_len:
                return tuple(bounds)
            bounds.append(mantissa * scale)
        scale *= 10


KV_TRANSFER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")  # vLLM's FinishReason, all exported from the start
KV_FAILURE_REASONS = ("unreachable", "unknown_blocks", "source_error", "injected")
LOCALITIES = ("same_rack", "cross_rack")  # spelled as the router spells its localities
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class NixlMetrics:
    """vLLM's NIXL connector series (exported by every engine with a NixlConnector, prefill and decode alike)."""

    def __init__(self, registry: CollectorRegistry, labels: tuple[str, ...], values: tuple[str, ...]) -> None:
        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=registry).labels(*values)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=registry).labels(*values)

        self.xfer_time = hist(
            "vllm:nixl_xfer_time_seconds",
            "Histogram of transfer duration for NIXL KV Cache transfers.",
            NIXL_XFER_TIME_BUCKETS,
        )
        self.post_time = hist(
            "vllm:nixl_post_time_seconds",
            "Histogram of transfer post time for NIXL KV Cache transfers.",
            NIXL_POST_TIME_BUCKETS,
        )
        self.bytes_transferred = hist(
            "vllm:nixl_bytes_transferred",
            "Histogram of bytes transferred per NIXL KV Cache transfers.",
            NIXL_BYTES_BUCKETS,
        )
        self.num_descriptors = hist(
            "vllm:nixl_num_descriptors",
            "Histogram of number of descriptors per NIXL  KV Cache transfers.",
            NIXL_DESCRIPTORS_BUCKETS,
        )
        self.failed_transfers = counter(
            "vllm:nixl_num_failed_transfers",
            "Number of failed NIXL KV Cache transfers, including handshake and notification failures. NOTE: KV "
            "expiry is tracked separately in vllm:nixl_num_kv_expired_reqs.",
        )
        self.failed_notifications = counter(
            "vllm:nixl_num_failed_notifications",
            "Number of failed NIXL KV Cache notifications. Retained for compatibility; these failures are also "
            "included in vllm:nixl_num_failed_transfers.",
        )
        self.kv_expired_reqs = counter(
            "vllm:nixl_num_kv_expired_reqs",
            "Number of requests that had their KV expire. NOTE: This metric is tracked on the P instance.",
        )
        self.notifications_after_expiry = counter(
            "vllm:nixl_num_notifications_after_expiry",
            "Number of completion notifications for requests that were no longer tracked, usually because their KV "
            "lease expired. The KV blocks may have been reused before the transfer finished. Counted per "
            "notification (one per remote rank), not per request.",
        )


class EngineMetrics:
    """All series of one engine, in a registry of its own; labels model_name and engine="0" as vLLM sets them.

    `nixl`: also export vLLM's vllm:nixl_* series (an engine started with a NIXL kv connector); else `self.nixl` is
    None and transfers are recorded in the pdfleet_engine_kv_transfer_* series only.
    """

    def __init__(self, model_name: str, max_model_len: int, nixl: bool = False) -> None:
        self.registry = CollectorRegistry()
        labels = ("model_name", "engine")
        values = (model_name, "0")

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=self.registry).labels(*values)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=self.registry).labels(*values)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=self.registry).labels(*values)

        self.ttft = hist(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = hist(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", TOKEN_LATENCY_BUCKETS
        )
        self.tpot = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            TOKEN_LATENCY_BUCKETS,
        )
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS
        )
        self.queue_time = hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.prefill_computed = hist(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            request_tokens_buckets(max_model_len),
        )
        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels + ("finished_reason",),
            registry=self.registry,
        )
        self.success = {reason: success.labels(*values, reason) for reason in FINISH_REASONS}
        transfer_labels = ("model_name", "locality")
        self.kv_transfer_seconds = Histogram(
            "pdfleet_engine_kv_transfer_seconds",
            "Time the decode side spent pulling KV blocks from a prefill.",
            transfer_labels,
            buckets=KV_TRANSFER_BUCKETS,
            registry=self.registry,
        )
        self.kv_transfer_bytes = Counter(
            "pdfleet_engine_kv_transfer_bytes",
            "KV bytes pulled from prefill instances.",
            transfer_labels,
            registry=self.registry,
        )
        failures = Counter(
            "pdfleet_engine_kv_transfer_failures",
            "KV pulls that failed, by reason.",
            ("model_name", "reason"),
            registry=self.registry,
        )
        self.kv_transfer_failures = {reason: failures.labels(model_name, reason) for reason in KV_FAILURE_REASONS}
        self.nixl = NixlMetrics(self.registry, labels, values) if nixl else None
        self._model_name = model_name
        for locality in LOCALITIES:
            self.kv_transfer_seconds.labels(model_name, locality)
            self.kv_transfer_bytes.labels(model_name, locality)

    def first_token(self, ttft_s: float, queue_s: float, prompt_tokens: int) -> None:
        """A request produced its first token."""
        self.ttft.observe(ttft_s)
        self.queue_time.observe(queue_s)
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc()

    def next_tokens(self, itl_s: float, count: int = 1) -> None:
        """A request produced `count` more tokens, each `itl_s` after the previous one."""
        for _ in range(count):
            self.itl.observe(itl_s)
        self.generation_tokens.inc(count)

    def finished(self, reason: str, e2e_s: float, decode_s: float, output_tokens: int, computed_tokens: int) -> None:
        """A request ended (reason: stop | length | abort | error) after computing `computed_tokens` of its prompt
        (the rest arrived from a remote prefill)."""
        self.success[reason].inc()
        self.e2e.observe(e2e_s)
        self.prefill_computed.observe(computed_tokens)
        if output_tokens > 1:
            self.tpot.observe(decode_s / (output_tokens - 1))

    def scheduler_state(self, running: int, waiting: int, kv_usage: float) -> None:
        """Scheduler gauges after a step."""
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_usage.set(kv_usage)

    def kv_transfer(
        self, seconds: float, num_bytes: int, same_rack: bool, post_seconds: float = 0.0, descriptors: int = 1
    ) -> None:
        """A KV pull completed (decode side): `seconds` in all, of which `post_seconds` to post it."""
        locality = LOCALITIES[0] if same_rack else LOCALITIES[1]
        self.kv_transfer_seconds.labels(self._model_name, locality).observe(seconds)
        self.kv_transfer_bytes.labels(self._model_name, locality).inc(num_bytes)
        if self.nixl:
            self.nixl.xfer_time.observe(seconds)
            self.nixl.post_time.observe(post_seconds)
            self.nixl.bytes_transferred.observe(num_bytes)
            self.nixl.num_descriptors.observe(descriptors)

    def kv_transfer_failed(self, reason: str) -> None:
        """A KV pull failed (reason: one of KV_FAILURE_REASONS); NIXL counts every kind as a failed transfer."""
        self.kv_transfer_failures[reason].inc()
        if self.nixl:
            self.nixl.failed_transfers.inc()

    def kv_expired(self, count: int = 1) -> None:
        """A prefill released KV blocks that no decode pulled before the lease ran out."""
        if self.nixl and count:
            self.nixl.kv_expired_reqs.inc(count)

    def kv_read_after_expiry(self) -> None:
        """A prefill saw a pull of blocks it no longer holds (expired or already pulled)."""
        if self.nixl:
            self.nixl.notifications_after_expiry.inc()

    def exposition(self) -> bytes:
        """Prometheus text format of every series."""
        return generate_latest(self.registry)
