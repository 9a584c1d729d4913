"""The simulated engine against the timing model it shares with the emulator."""

from __future__ import annotations

import pytest

from pdfleet.perfmodel.presets import gpu_preset, model_preset
from pdfleet.perfmodel.timing import Hardware, StepLoad, decode_step_time, prefill_time, step_time
from pdfleet.sim.engine import SimEngine, SimSeq

HW = Hardware(model_preset("llama-3.1-8b"), gpu_preset("H100-SXM"))


def engine(**kw) -> SimEngine:
    args = dict(max_num_seqs=256, max_num_batched_tokens=8192, kv_capacity_tokens=400_000)
    args.update(kw)
    return SimEngine("e", "decode", "rack-0", "zone-0", HW, **args)


def drive(e: SimEngine, seqs: list[tuple[float, SimSeq]]) -> None:
    """Run the engine alone: submissions at their times, steps in between."""
    pending = sorted(seqs, key=lambda x: x[0])
    end = None
    for _ in range(100_000):
        if pending and (end is None or pending[0][0] <= end):
            t, seq = pending.pop(0)
            new_end = e.submit(seq, t)
            end = new_end if new_end is not None else end
        elif end is not None:
            _, _, end = e.step_done(end)
        else:
            return
    raise AssertionError("engine did not drain")


def test_single_request_matches_prefill_and_decode_steps() -> None:
    e = engine()
    seq = SimSeq(None, 0.0, 1000, 11)
    drive(e, [(0.0, seq)])
    assert seq.first_token_at == pytest.approx(prefill_time(HW, 1000))
    decode = sum(decode_step_time(HW, 1, 1000 + k + 1) for k in range(10))
    assert seq.finished_at - seq.first_token_at == pytest.approx(decode, rel=0.01)


def test_long_prompt_is_chunked() -> None:
    e = engine(max_num_batched_tokens=2048)
    seq = SimSeq(None, 0.0, 5000, 1)
    drive(e, [(0.0, seq)])
    assert seq.first_token_at == pytest.approx(prefill_time(HW, 5000, 2048))
    assert seq.finished_at == seq.first_token_at


def test_remote_kv_leaves_one_token_to_compute() -> None:
    e = engine()
    seq = SimSeq(None, 0.0, 3000, 2, cached=3000)
    drive(e, [(0.0, seq)])
    one = step_time(HW, StepLoad(prefill_tokens=1, prefill_attention_pairs=3000))
    assert seq.first_token_at == pytest.approx(one)


def test_arrival_mid_span_joins_after_the_step_in_progress() -> None:
    e = engine()
    long = SimSeq(None, 0.0, 100, 500)
    late = SimSeq(None, 0.0, 100, 2)
    drive(e, [(0.0, long), (0.5, late)])
    step = decode_step_time(HW, 1, 200)
    assert late.arrival == 0.0 and late.first_token_at is not None
    assert 0.5 <= late.first_token_at <= 0.5 + 3 * step  # not held until the long request's span ends
    assert long.finished_at > late.finished_at


def test_kv_capacity_limits_admission() -> None:
    e = engine(kv_capacity_tokens=2500)
    a, b = SimSeq(None, 0.0, 1000, 100), SimSeq(None, 0.0, 1000, 100)
    c = SimSeq(None, 0.0, 1000, 100)
    drive(e, [(0.0, a), (0.0, b), (0.0, c)])
    assert c.first_token_at >= min(a.finished_at, b.finished_at)  # the third waits for KV to free up
    assert e.kv_reserved == 0 and e.idle


def test_max_num_seqs_limits_the_batch() -> None:
    e = engine(max_num_seqs=2)
    seqs = [SimSeq(None, 0.0, 100, 50) for _ in range(3)]
    drive(e, [(0.0, s) for s in seqs])
    assert seqs[2].first_token_at >= min(seqs[0].finished_at, seqs[1].finished_at)


def test_prefix_cache_is_every_free_kv_block_lru_evicted() -> None:
    e = engine(kv_capacity_tokens=64 * 100, prefix_caching=True)
    first = SimSeq(None, 0.0, 64 * 60, 1, prefix=tuple(range(60)))  # 60 % of the KV: more than a 10 % cache held
    drive(e, [(0.0, first)])
    assert e.cached_prefix_tokens(first.prefix) == 64 * 60
    second = SimSeq(None, 1.0, 64 * 70, 1, prefix=tuple(range(100, 170)))  # needs blocks the first prefix holds
    drive(e, [(1.0, second)])
    assert e.cached_prefix_tokens(second.prefix) == 64 * 70
    assert e.cached_prefix_tokens(first.prefix) == 0  # least recently used: evicted for the second's blocks
    assert len(e.prefix_cache) <= 100
