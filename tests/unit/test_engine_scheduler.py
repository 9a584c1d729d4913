"""Continuous-batching scheduler on a real event loop (no sockets), with modelled time sped up."""

import asyncio

from pdfleet.engine.faults import Faults
from pdfleet.engine.kvcache import KvBlockPool
from pdfleet.engine.metrics import EngineMetrics
from pdfleet.engine.scheduler import Scheduler, Sequence
from pdfleet.perfmodel import presets
from pdfleet.perfmodel.timing import Hardware, prefill_time

HW = Hardware(presets.model_preset("llama-3.1-8b"), presets.gpu_preset("H100-SXM"))


def make(capacity_blocks=10_000, max_num_seqs=256, speedup=1000.0):
    metrics = EngineMetrics("t", 2048)
    sched = Scheduler(
        HW,
        KvBlockPool(capacity_blocks, 16),
        metrics,
        Faults(),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=2048,
        speedup=speedup,
        kv_hold_ttl_s=60,
    )
    return sched, metrics


async def drain(seq: Sequence) -> int:
    total = 0
    while count := await asyncio.wait_for(seq.read(), 5):
        total += count
    return total


def seq(sched, name, prompt=100, out=5, **kw):
    return Sequence(name, prompt, out, "length", sched.now(), **kw)


async def run_all(sched, seqs):
    task = asyncio.create_task(sched.run())
    try:
        for s in seqs:
            sched.submit(s)
        return await asyncio.gather(*(drain(s) for s in seqs))
    finally:
        task.cancel()


async def test_one_request_gets_its_tokens_after_the_modelled_prefill():
    sched, metrics = make(speedup=10.0)
    s = seq(sched, "a", prompt=4000, out=4)
    assert await run_all(sched, [s]) == [4]
    assert s.done and s.generated == 4 and sched.pool.used_blocks == 0
    ttft = s.first_token_at - s.arrival
    assert ttft >= prefill_time(HW, 4000, 2048) / 10 * 0.9
    assert metrics.success["length"]._value.get() == 1
    assert metrics.generation_tokens._value.get() == 4


async def test_max_num_seqs_queues_the_rest():
    sched, metrics = make(max_num_seqs=2)
    seqs = [seq(sched, str(i), out=20) for i in range(5)]
    task = asyncio.create_task(sched.run())
    try:
        for s in seqs:
            sched.submit(s)
        await asyncio.sleep(0)
        await asyncio.wait_for(seqs[0].read(), 5)
        assert len(sched.running) == 2 and len(sched.waiting) == 3
        assert metrics.waiting._value.get() == 3
        assert [await drain(s) for s in seqs][1:] == [20, 20, 20, 20]
    finally:
        task.cancel()


async def test_kv_budget_limits_batch_and_preempts_without_losing_tokens():
    sched, metrics = make(capacity_blocks=12)  # 192 tokens of KV
    seqs = [seq(sched, str(i), prompt=40, out=60) for i in range(4)]  # each grows to 100 tokens = 7 blocks
    assert await run_all(sched, seqs) == [60, 60, 60, 60]
    assert metrics.preemptions._value.get() > 0
    assert sched.pool.used_blocks == 0


async def test_remote_kv_skips_prefill_and_hold_keeps_blocks():
    sched, _ = make(speedup=1.0)
    pulled = seq(sched, "d", prompt=8000, out=2, computed_tokens=7999)
    held = seq(sched, "p", prompt=100, out=1, hold_kv=True)
    await run_all(sched, [pulled, held])
    assert pulled.first_token_at - pulled.arrival < prefill_time(HW, 8000) / 4
    # 100 tokens in blocks of 16: 6 full blocks and the partial 7th, all offered (vLLM 0.32's NIXL producer)
    assert held.held_block_ids == [1, 2, 3, 4, 5, 6, 7] and sched.pool.used_blocks == 7


async def test_abort_frees_blocks():
    sched, metrics = make(speedup=1.0)
    s = seq(sched, "x", prompt=1000, out=10_000)
    task = asyncio.create_task(sched.run())
    try:
        sched.submit(s)
        await asyncio.wait_for(s.read(), 5)
        sched.abort(s)
        assert s.done and s.aborted and sched.pool.used_blocks == 0
        # as vLLM 0.32: a client's abort is not counted among finished requests
        assert metrics.success["abort"]._value.get() == 0 and metrics.e2e._sum.get() == 0
    finally:
        task.cancel()
