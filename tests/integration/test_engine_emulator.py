"""Real emulator processes on 127.0.0.1: OpenAI endpoints, the PD KV handshake with real pulls, faults, metrics."""

import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pdfleet.testing.engine_process import start_engine

SPEEDUP = ["--emulator-speedup", "5"]
PROMPT = "word " * 400  # 2000 characters = 500 tokens = 32 KV blocks of 16 (31 full, one partial)
QWEN_KV_BYTES_PER_TOKEN = 2 * 24 * 2 * 64 * 2
PREFILL_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


@pytest.fixture(scope="module")
def both():
    with start_engine("both", served_model_name="qwen", extra_args=SPEEDUP) as engine:
        yield engine


@pytest.fixture(scope="module")
def prefill_a():
    with start_engine("prefill", rack="rack-a", served_model_name="qwen", extra_args=SPEEDUP) as engine:
        yield engine


@pytest.fixture(scope="module")
def decode_a():
    with start_engine("decode", rack="rack-a", served_model_name="qwen", extra_args=SPEEDUP) as engine:
        yield engine


def sse_events(response: httpx.Response) -> list:
    """Parsed `data:` events of a stream; the raw body must be exactly `data: ...\\n\\n` frames."""
    raw = response.read().decode()
    frames = raw.split("\n\n")
    assert frames[-1] == ""
    assert all(f.startswith("data: ") for f in frames[:-1])
    return [f[len("data: ") :] for f in frames[:-1]]


def stream(url: str, path: str, body: dict) -> tuple[int, list]:
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=10) as response:
        return response.status_code, sse_events(response)


def metric_samples(url: str) -> dict:
    """{(name, frozenset(labels)): value} and family types under key ('__type__', name)."""
    out = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        out[("__type__", family.name)] = family.type
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def prefill(engine, prompt=PROMPT) -> dict:
    response = httpx.post(
        engine.url + "/v1/completions",
        timeout=10,
        json={
            "model": "qwen",
            "prompt": prompt,
            "max_tokens": 1,
            "stream": False,
            "kv_transfer_params": PREFILL_PARAMS,
        },
    )
    assert response.status_code == 200, response.text
    return response.json()["kv_transfer_params"]


def test_completions_non_stream_and_stream(both):
    response = httpx.post(
        both.url + "/v1/completions", json={"model": "qwen", "prompt": "hello there", "max_tokens": 3}, timeout=10
    )
    body = response.json()
    assert response.status_code == 200 and body["object"] == "text_completion"
    assert body["choices"][0]["text"] == "alpha bravo charlie " and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {
        "prompt_tokens": 3,
        "total_tokens": 6,
        "completion_tokens": 3,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    status, events = stream(
        both.url,
        "/v1/completions",
        {
            "model": "qwen",
            "prompt": [1, 2, 3, 4],
            "max_tokens": 50,
            "min_tokens": 5,
            "stream_options": {"include_usage": True},
        },
    )
    assert status == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text_chunks, usage = chunks[:-1], chunks[-1]
    assert len(text_chunks) == 50 and "".join(c["choices"][0]["text"] for c in text_chunks).startswith("alpha bravo")
    assert [c["choices"][0]["finish_reason"] for c in text_chunks] == [None] * 49 + ["length"]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 50 and usage["usage"]["prompt_tokens"] == 4


def test_chat_non_stream_and_stream(both):
    messages = [{"role": "user", "content": "abcdefgh"}]
    response = httpx.post(
        both.url + "/v1/chat/completions",
        timeout=10,
        json={"model": "qwen", "messages": messages, "max_completion_tokens": 2},
    )
    body = response.json()
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"] == "alpha bravo "
    assert body["usage"]["prompt_tokens"] == 3 + 4 + 2
    status, events = stream(
        both.url,
        "/v1/chat/completions",
        {"model": "qwen", "messages": messages, "max_tokens": 600, "ignore_eos": False},
    )
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" and c["id"].startswith("chatcmpl-") for c in chunks)
    assert len(chunks) == 1 + 256  # the emulated model stops (EOS) after --emulator-output-len tokens
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_models_health_version_and_bad_requests(both):
    assert httpx.get(both.url + "/health").status_code == 200
    assert httpx.get(both.url + "/version").json()["version"]
    assert [m["id"] for m in httpx.get(both.url + "/v1/models").json()["data"]] == ["qwen"]
    wrong = httpx.post(both.url + "/v1/completions", json={"model": "other", "prompt": "x"})
    assert wrong.status_code == 404 and wrong.json()["error"]["type"] == "NotFoundError"
    for body in (
        {"model": "qwen", "prompt": "x", "n": 2},
        {"model": "qwen", "prompt": "x", "max_tokens": 10**6},
        {"model": "qwen"},
    ):
        response = httpx.post(both.url + "/v1/completions", json=body)
        assert response.status_code == 400 and response.json()["error"]["code"] == 400


def test_pd_handshake_pulls_kv_for_real(prefill_a, decode_a):
    params = prefill(prefill_a)
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    # vLLM 0.32's NIXL producer fields: a block list per KV group, every block of the prompt (the partial last one too)
    assert len(params["remote_block_ids"]) == 1 and len(params["remote_block_ids"][0]) == 32
    assert params["remote_port"] == prefill_a.port and params["remote_num_tokens"] == 500
    assert params["remote_host"] == "127.0.0.1" and params["remote_rack"] == "rack-a" and params["tp_size"] == 1
    assert params["transfer_mode"] == "pull" and params["remote_request_id"].startswith("cmpl-")
    assert httpx.get(prefill_a.url + "/internal/state").json()["kv_held_requests"] == 1
    before = metric_samples(decode_a.url)
    status, events = stream(
        decode_a.url,
        "/v1/completions",
        {"model": "qwen", "prompt": PROMPT, "max_tokens": 8, "kv_transfer_params": params},
    )
    assert status == 200 and len(events) == 9 and events[-1] == "[DONE]"
    assert httpx.get(prefill_a.url + "/internal/state").json()["kv_held_requests"] == 0  # the pull freed them
    after = metric_samples(decode_a.url)
    labels = frozenset({"model_name": "qwen", "locality": "same_rack"}.items())
    moved = (
        after[("pdfleet_engine_kv_transfer_bytes_total", labels)]
        - before[("pdfleet_engine_kv_transfer_bytes_total", labels)]
    )
    assert moved == 500 * QWEN_KV_BYTES_PER_TOKEN
    assert (
        after[("pdfleet_engine_kv_transfer_seconds_count", labels)]
        == before[("pdfleet_engine_kv_transfer_seconds_count", labels)] + 1
    )
    nixl = {"model_name": "qwen", "engine": "0"}
    assert after[("vllm:nixl_xfer_time_seconds_count", frozenset(nixl.items()))] == 1
    assert after[("vllm:nixl_bytes_transferred_sum", frozenset(nixl.items()))] == moved
    # the blocks are released: as with vLLM, a second read of them still "succeeds" (NIXL cannot refuse a read), and
    # the prefill counts a notification for a request it no longer tracks
    again = httpx.post(
        decode_a.url + "/v1/completions",
        timeout=10,
        json={"model": "qwen", "prompt": PROMPT, "max_tokens": 8, "stream": True, "kv_transfer_params": params},
    )
    assert again.status_code == 200
    late = metric_samples(prefill_a.url)[("vllm:nixl_num_notifications_after_expiry_total", frozenset(nixl.items()))]
    assert late == 1
    # blocks this prefill never held are refused (the emulator's check; vLLM would read whatever they hold)
    bogus = {**params, "remote_request_id": "cmpl-never-held-0-00000000"}
    refused = httpx.post(
        decode_a.url + "/v1/completions",
        timeout=10,
        json={"model": "qwen", "prompt": PROMPT, "max_tokens": 8, "kv_transfer_params": bogus},
    )
    assert refused.status_code == 500 and "no KV blocks held" in refused.json()["error"]["message"]


def test_cross_rack_pull_is_labelled_cross_rack(prefill_a):
    with start_engine("decode", rack="rack-b", served_model_name="qwen", extra_args=SPEEDUP) as decode_b:
        params = prefill(prefill_a)
        response = httpx.post(
            decode_b.url + "/v1/completions",
            timeout=10,
            json={"model": "qwen", "prompt": PROMPT, "max_tokens": 2, "kv_transfer_params": params},
        )
        assert response.status_code == 200
        labels = frozenset({"model_name": "qwen", "locality": "cross_rack"}.items())
        assert metric_samples(decode_b.url)[("pdfleet_engine_kv_transfer_seconds_count", labels)] == 1


def test_pull_from_dead_prefill_fails_or_recomputes(decode_a):
    with start_engine("prefill", rack="rack-a", served_model_name="qwen") as doomed:
        params = prefill(doomed)
        doomed.kill()
    response = httpx.post(
        decode_a.url + "/v1/completions",
        timeout=15,
        json={"model": "qwen", "prompt": PROMPT, "max_tokens": 4, "stream": True, "kv_transfer_params": params},
    )
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["type"] == "InternalServerError" and "unreachable" in error["message"]
    failures = metric_samples(decode_a.url)
    assert (
        failures[
            (
                "pdfleet_engine_kv_transfer_failures_total",
                frozenset({"model_name": "qwen", "reason": "unreachable"}.items()),
            )
        ]
        >= 1
    )
    with start_engine(
        "decode", served_model_name="qwen", extra_args=["--kv-load-failure-policy", "recompute", *SPEEDUP]
    ) as tolerant:
        response = httpx.post(
            tolerant.url + "/v1/completions",
            timeout=15,
            json={"model": "qwen", "prompt": PROMPT, "max_tokens": 4, "kv_transfer_params": params},
        )
        assert response.status_code == 200 and response.json()["choices"][0]["text"] == "alpha bravo charlie delta "


def test_injected_transfer_failures(prefill_a, decode_a):
    httpx.post(prefill_a.url + "/internal/faults", json={"fail_kv_source": 1}).raise_for_status()
    response = httpx.post(
        decode_a.url + "/v1/completions",
        timeout=10,
        json={"model": "qwen", "prompt": PROMPT, "max_tokens": 2, "kv_transfer_params": prefill(prefill_a)},
    )
    assert response.status_code == 500 and "injected KV source failure" in response.json()["error"]["message"]
    httpx.post(decode_a.url + "/internal/faults", json={"fail_kv_pull": 1}).raise_for_status()
    response = httpx.post(
        decode_a.url + "/v1/completions",
        timeout=10,
        json={"model": "qwen", "prompt": PROMPT, "max_tokens": 2, "kv_transfer_params": prefill(prefill_a)},
    )
    assert response.status_code == 500
    samples = metric_samples(decode_a.url)
    for reason in ("source_error", "injected"):
        key = ("pdfleet_engine_kv_transfer_failures_total", frozenset({"model_name": "qwen", "reason": reason}.items()))
        assert samples[key] >= 1
    assert httpx.get(decode_a.url + "/internal/faults").json()["fail_kv_pull"] == 0


def test_metrics_names_types_and_counts_moving(both):
    before = metric_samples(both.url)
    expected_types = {
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:request_time_per_output_token_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:request_queue_time_seconds": "histogram",
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        "vllm:request_success": "counter",
        "pdfleet_engine_kv_transfer_seconds": "histogram",
        "pdfleet_engine_kv_transfer_bytes": "counter",
        "pdfleet_engine_kv_transfer_failures": "counter",
    }
    for name, kind in expected_types.items():
        assert before[("__type__", name)] == kind, name
    httpx.post(both.url + "/v1/completions", json={"model": "qwen", "prompt": "x" * 40, "max_tokens": 5}, timeout=10)
    after = metric_samples(both.url)
    engine = {"model_name": "qwen", "engine": "0"}
    key = lambda name, **extra: (name, frozenset({**engine, **extra}.items()))  # noqa: E731
    assert after[key("vllm:prompt_tokens_total")] - before[key("vllm:prompt_tokens_total")] == 10
    assert after[key("vllm:generation_tokens_total")] - before[key("vllm:generation_tokens_total")] == 5
    assert (
        after[key("vllm:request_success_total", finished_reason="length")]
        == before[key("vllm:request_success_total", finished_reason="length")] + 1
    )
    assert (
        after[key("vllm:inter_token_latency_seconds_count")] - before[key("vllm:inter_token_latency_seconds_count")]
        == 4
    )
    for name in (
        "vllm:time_to_first_token_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_queue_time_seconds_count",
        "vllm:request_time_per_output_token_seconds_count",
    ):
        assert after[key(name)] == before[key(name)] + 1, name
    assert key("vllm:time_to_first_token_seconds_bucket", le="0.001") in after
    assert after[key("vllm:num_requests_running")] == 0


def test_health_and_hang_faults(both):
    httpx.post(both.url + "/internal/faults", json={"unhealthy": True}).raise_for_status()
    assert httpx.get(both.url + "/health").status_code == 503
    httpx.post(both.url + "/internal/faults", json={"unhealthy": False, "hang": True}).raise_for_status()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(both.url + "/v1/completions", json={"model": "qwen", "prompt": "x", "max_tokens": 1}, timeout=0.5)
    httpx.post(both.url + "/internal/faults", json={"hang": False}).raise_for_status()
    assert (
        httpx.post(
            both.url + "/v1/completions", json={"model": "qwen", "prompt": "x", "max_tokens": 1}, timeout=5
        ).status_code
        == 200
    )
    assert httpx.post(both.url + "/internal/faults", json={"bogus": 1}).status_code == 400


def test_crash_mid_stream():
    with start_engine("decode", served_model_name="qwen", extra_args=["--fault-crash-after-tokens", "3"]) as engine:
        with pytest.raises(httpx.RemoteProtocolError):
            with httpx.stream(
                "POST",
                engine.url + "/v1/completions",
                timeout=10,
                json={"model": "qwen", "prompt": "x", "max_tokens": 10, "stream": True},
            ) as response:
                received = []
                for line in response.iter_lines():
                    received.append(line)
        assert sum(1 for line in received if line.startswith("data: {")) <= 3
        engine.proc.wait(timeout=5)
        assert engine.proc.returncode == 70


def test_zero_delay_handshake_with_itself():
    with start_engine("both", served_model_name="qwen", extra_args=["--emulator-zero-delay"]) as engine:
        params = prefill(engine)
        status, events = stream(
            engine.url,
            "/v1/chat/completions",
            {
                "model": "qwen",
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 4,
                "kv_transfer_params": params,
            },
        )
        assert status == 200 and len(events) == 1 + 4 + 1
        samples = metric_samples(engine.url)
        engine_labels = {"model_name": "qwen", "engine": "0"}
        assert (
            samples[("vllm:request_success_total", frozenset({**engine_labels, "finished_reason": "length"}.items()))]
            == 2
        )
