"""The engine contract suite: every test runs against the emulator and against real vLLM 0.32 (CPU build, tiny Llama).

`pair` is a module fixture parametrized over the two implementations, so in each module pytest runs every emulator
case first with one emulator pair, stops it, then every vLLM case with one real vLLM pair (start-up 45-90 s), stopped
at the module's end so no real engine outlives it. Each engine has a loopback address of its own (127.1.9.N). vLLM
cases carry the `real_vllm` marker (`-m "not real_vllm"` deselects them); without the vLLM venv or the tiny model
they skip locally and fail in CI.

Real vLLM engines take about 3 GB and, with NIXL, a core each even when idle: run this suite under
`flock /tmp/pdfleet-real-vllm.lock ...` so that no other real-vLLM run overlaps it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from contract_support import LEASE_S, Pair

from pdfleet.localfleet import real_vllm
from pdfleet.testing.engine_process import free_loopback_host, start_engine
from pdfleet.testing.prerequisites import missing_prerequisite

IMPLEMENTATIONS = ("emulator", "vllm")
MODEL = real_vllm.SERVED_MODEL_NAME
# the emulator gets the same vLLM flags as the CPU engines (it ignores --dtype and --enforce-eager) and the same
# NIXL lease; it runs in real time so that long generations take seconds, as on the CPU
EMULATOR_ARGS = [*real_vllm.CPU_ENGINE_ARGS]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every contract case that runs against real vLLM."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("pair") == "vllm":
            item.add_marker(pytest.mark.real_vllm)


def _keep_logs(pair: Pair) -> None:
    """With env PDFLEET_CONTRACT_LOGS=DIR, copy both engines' logs there before they are stopped (and removed)."""
    folder = os.environ.get("PDFLEET_CONTRACT_LOGS")
    if not folder:
        return
    os.makedirs(folder, exist_ok=True)
    for engine in pair.engines:
        with open(os.path.join(folder, f"{pair.impl}-{engine.role}.log"), "w", encoding="utf-8") as handle:
            handle.write(engine.log())


def _emulator_pair() -> Iterator[Pair]:
    lease = {"kv_lease_duration": LEASE_S}
    prefill_host = free_loopback_host()
    prefill = start_engine(
        "prefill", host=prefill_host, model=MODEL, served_model_name=MODEL, extra_args=EMULATOR_ARGS,
        kv_extra_config=lease,
    )  # fmt: skip
    try:
        decode = start_engine(
            "decode", host=free_loopback_host(taken=[prefill_host]), model=MODEL, served_model_name=MODEL,
            extra_args=EMULATOR_ARGS, kv_extra_config=lease,
        )  # fmt: skip
    except BaseException:
        prefill.stop()
        raise
    pair = Pair("emulator", prefill, decode, MODEL, LEASE_S)
    try:
        yield pair
    finally:
        _keep_logs(pair)
        prefill.stop()
        decode.stop()


def _vllm_pair() -> Iterator[Pair]:
    if why := real_vllm.missing():
        missing_prerequisite(why)
    from pdfleet.testing.vllm_process import start_vllm_pair

    # one core each: two NIXL engines that float over both cores (or both pin the same one) slow every step down
    prefill, decode = start_vllm_pair(
        served_model_name=MODEL,
        kv_extra_config={"kv_lease_duration": LEASE_S},
        prefill_env={"VLLM_CPU_OMP_THREADS_BIND": "0"},
        decode_env={"VLLM_CPU_OMP_THREADS_BIND": "1"},
    )
    pair = Pair("vllm", prefill, decode, MODEL, LEASE_S)
    try:
        yield pair
    finally:
        _keep_logs(pair)
        prefill.stop()
        decode.stop()


@pytest.fixture(scope="module", params=IMPLEMENTATIONS)
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    """A healthy prefill (kv_producer) + decode (kv_consumer) pair of one implementation for one test module: real
    engines are gone before the next module (and the real-vLLM e2e tests after it) start."""
    yield from (_vllm_pair() if request.param == "vllm" else _emulator_pair())
