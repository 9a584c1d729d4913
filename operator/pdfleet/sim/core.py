"""The discrete-event fleet simulator: virtual time, one heap of events, no sockets.

Events: request arrivals (read in trace order, not heaped), engine step/span ends, KV transfers landing on a decode
instance, replicas becoming Ready, and the scaling policy's ticks. Routing uses the router's own pure choices
(`pdfleet.router.policy`); engines are `pdfleet.sim.engine.SimEngine`; scaling decisions come from a ScalingPolicy.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Protocol

from pdfleet import POOLS
from pdfleet.perfmodel.timing import kv_transfer_time, transfer_link
from pdfleet.router.policy import (
    PrefixAffinity,
    chain_hashes,
    choose_decode,
    choose_direct_decode,
    choose_prefill,
    should_disaggregate,
)
from pdfleet.sim.config import FleetConfig
from pdfleet.sim.engine import SimEngine, SimSeq
from pdfleet.sim.observe import PoolStats
from pdfleet.sim.trace import TraceRequest

COLOCATED_POOL = "decode"  # colocated instances run both phases; they are counted as one pool under this name
SNAPSHOT_S = 5.0  # cadence of counter snapshots for windowed rates
STALL_S = 1800.0  # all requests in, nothing running, nothing completed this long: the run ends as stalled
WARMUP_S = 60.0  # no scaling decision before one full metrics window of the trace (the fleet ran before it)
_STEP, _KV, _READY, _TICK, _SNAP = range(5)


class RequestRecord:
    """One trace request's journey: set by the simulator, read by the report."""

    __slots__ = ("request", "prefix", "ttft", "tpot", "finished_at", "path", "kv_transfer_s", "locality", "rejected")

    def __init__(self, request: TraceRequest) -> None:
        self.request = request
        self.prefix = chain_hashes(request.prefix_blocks)  # every engine it visits looks its prefix up
        self.ttft: float | None = None  # client-side: arrival to first token of the answer
        self.tpot: float | None = None  # mean inter-token time of the answer (0 for one-token answers)
        self.finished_at: float | None = None
        self.path = ""  # "pd", "direct" (short prompt, or no prefill replica: on a decode) or "colocated"
        self.kv_transfer_s = 0.0
        self.locality = ""
        self.rejected = False  # prompt + output over the context limit: refused at arrival, as vLLM does


@dataclass
class Replica:
    """One instance's lifecycle: GPUs are held from `created_at` until `removed_at`."""

    engine: SimEngine
    gpus: int
    created_at: float
    ready_at: float
    ready: bool = False
    removed_at: float | None = None


@dataclass
class ReplicaEvent:
    """The pool's size after a change: for the timeline plots."""

    time: float
    pool: str
    ready: int
    total: int


class FleetView(Protocol):
    """What a scaling policy may look at (the simulator implements it)."""

    fleet: FleetConfig

    def desired(self, pool: str) -> int:
        """Replicas the policy last asked for in `pool`."""

    def readings(self, now: float, window_s: float, percentile: float) -> dict:
        """Per-pool signals over the last `window_s`, as the autoscaler would read them."""

    def client_window(self, now: float, window_s: float) -> dict[str, float]:
        """Client-side arrival statistics over the last `window_s`."""


class ScalingPolicy(Protocol):
    """Decides replica counts; `interval_s` None means static (decide is never called)."""

    name: str
    interval_s: float | None

    def initial(self, fleet: FleetConfig) -> dict[str, int]:
        """Replicas per pool at the start of the run."""

    def decide(self, now: float, view: FleetView) -> dict[str, int]:
        """Replicas per pool wanted at `now`."""

    def notes(self) -> tuple[str, ...]:
        """What the policy itself reported over the run (e.g. latency targets no replica count meets)."""


@dataclass
class SimResult:
    """Everything the report needs from one run."""

    policy: str
    fleet: FleetConfig
    records: list[RequestRecord]
    replicas: list[Replica]
    timeline: list[ReplicaEvent]
    horizon_s: float
    end_s: float
    events: int
    decisions: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    # per pool: (decisions the racks could not fully place, most replicas missing at once)
    denied: dict[str, tuple[int, int]] = field(default_factory=dict)
    stalled: str = ""  # why the run stopped before every request finished; empty when all did
    policy_notes: tuple[str, ...] = ()  # ScalingPolicy.notes() at the end of the run


class Simulation:
    """One run of a trace against a fleet under a scaling policy."""

    def __init__(self, fleet: FleetConfig, trace: list[TraceRequest], policy: ScalingPolicy) -> None:
        fleet.validate()
        self.fleet = fleet
        self.trace = trace
        self.policy = policy
        self.pools = POOLS if fleet.disaggregated else (COLOCATED_POOL,)
        self.stats = {pool: PoolStats(pool) for pool in self.pools}
        self.replicas: dict[str, list[Replica]] = {pool: [] for pool in self.pools}
        self.all_replicas: list[Replica] = []
        self.timeline: list[ReplicaEvent] = []
        self.decisions: list[tuple[float, dict[str, int]]] = []
        self.records = [RequestRecord(r) for r in trace]
        self.affinity = PrefixAffinity()
        # requests waiting at the router for a Ready instance of the pool, with the prefill that holds their KV
        self.backlog: dict[str, list[tuple[RequestRecord, SimEngine | None]]] = {pool: [] for pool in self.pools}
        self.rack_gpus = {rack: 0 for rack, _ in fleet.rack_names()}
        self.zone_of = dict(fleet.rack_names())
        self._heap: list[tuple[float, int, int, object, int]] = []
        self._order = itertools.count()
        self._names = itertools.count()
        self._tiebreak = 0
        self.now = 0.0
        self.events = 0
        self.stalled = ""
        self._arrived = 0
        self._completed = 0
        self._progress_at = 0.0  # last arrival, step, KV landing or replica start
        self.denied: dict[str, tuple[int, int]] = {}

    # -- heap ----------------------------------------------------------------------------------------------------
    def _push(self, time: float, kind: int, payload: object, version: int = 0) -> None:
        heapq.heappush(self._heap, (time, next(self._order), kind, payload, version))

    def _schedule_engine(self, engine: SimEngine, end: float | None) -> None:
        if end is not None:
            self._push(end, _STEP, engine, engine.version)

    # -- replicas ------------------------------------------------------------------------------------------------
    def _active(self, pool: str) -> list[Replica]:
        return [r for r in self.replicas[pool] if r.removed_at is None and not r.engine.draining]

    def desired(self, pool: str) -> int:
        """Replicas asked for (starting or ready, not draining)."""
        return len(self._active(pool))

    def _pick_rack(self, pool: str) -> str | None:
        """Rack for a new replica: fewest of this pool's replicas, then most free GPUs (spreads like RackPaired)."""
        per_rack = {rack: 0 for rack in self.rack_gpus}
        for r in self._active(pool):
            per_rack[r.engine.rack] += 1
        fits = [
            rack
            for rack, used in self.rack_gpus.items()
            if used + self.fleet.gpus_per_replica <= self.fleet.gpus_per_rack
        ]
        if not fits:
            return None
        return min(fits, key=lambda rack: (per_rack[rack], self.rack_gpus[rack], rack))

    def _add_replica(self, pool: str, ready_now: bool) -> bool:
        rack = self._pick_rack(pool)
        if rack is None:
            return False
        fleet = self.fleet
        engine = SimEngine(
            f"{pool}-{next(self._names)}",
            pool,
            rack,
            self.zone_of[rack],
            fleet.hardware,
            max_num_seqs=fleet.max_num_seqs,
            max_num_batched_tokens=fleet.max_num_batched_tokens,
            kv_capacity_tokens=fleet.kv_capacity_tokens,
            prefix_caching=fleet.prefix_caching,
            prefix_block_tokens=fleet.prefix_block_tokens,
            stats=self.stats[pool],
        )
        ready_at = self.now if ready_now else self.now + fleet.startup_s
        replica = Replica(engine, fleet.gpus_per_replica, self.now, ready_at)
        self.rack_gpus[rack] += fleet.gpus_per_replica
        self.replicas[pool].append(replica)
        self.all_replicas.append(replica)
        if ready_now:
            replica.ready = True
        else:
            self._push(ready_at, _READY, replica)
        return True

    def _remove(self, replica: Replica) -> None:
        replica.removed_at = self.now
        self.rack_gpus[replica.engine.rack] -= replica.gpus

    def _retire_if_drained(self, replica: Replica) -> None:
        if (
            replica.engine.draining
            and replica.removed_at is None
            and replica.engine.idle
            and replica.engine.inflight == 0
        ):
            self._remove(replica)
            self._record_sizes(replica.engine.pool)

    def scale(self, pool: str, target: int) -> None:
        """Move the pool to `target` replicas: add starting ones, or cancel starting ones then drain the newest."""
        target = max(self._min_replicas(pool), target)
        active = self._active(pool)
        if target > len(active):
            self._add_replicas(pool, target - len(active), ready_now=False)
        elif target < len(active):
            surplus = len(active) - target
            # starting replicas first (newest first), then the newest ready ones (StatefulSets shrink from the top)
            starting = [r for r in reversed(active) if not r.ready]
            ready = [r for r in reversed(active) if r.ready]
            for replica in (starting + ready)[:surplus]:
                if not replica.ready:
                    self._remove(replica)
                else:
                    replica.engine.draining = True
                    self._retire_if_drained(replica)
        self._record_sizes(pool)

    def _min_replicas(self, pool: str) -> int:
        """A PD fleet's prefill pool may be empty (the router serves every prompt on a decode); a pool that serves
        requests end to end may not."""
        return 0 if pool == "prefill" else 1

    def _add_replicas(self, pool: str, count: int, ready_now: bool) -> None:
        """Add up to `count` replicas; what the racks cannot hold is counted as denied."""
        for placed in range(count):
            if not self._add_replica(pool, ready_now):
                decisions, most = self.denied.get(pool, (0, 0))
                self.denied[pool] = (decisions + 1, max(most, count - placed))
                return

    def _record_sizes(self, pool: str) -> None:
        live = [r for r in self.replicas[pool] if r.removed_at is None]
        ready = sum(1 for r in live if r.ready and not r.engine.draining)
        self.timeline.append(ReplicaEvent(self.now, pool, ready, len(live)))

    def _ready_engines(self, pool: str) -> list[SimEngine]:
        return [r.engine for r in self.replicas[pool] if r.ready and r.removed_at is None]

    # -- views for policies --------------------------------------------------------------------------------------
    def readings(self, now: float, window_s: float, percentile: float) -> dict:
        """PoolSignals per pool, as Prometheus would report them (ready replicas report, starting ones do not)."""
        out = {}
        for pool in self.pools:
            engines = self._ready_engines(pool)
            out[pool] = self.stats[pool].reading(
                now,
                window_s,
                percentile,
                reporting=len(engines),
                queue_total=float(sum(e.queued for e in engines)),
                running_total=float(sum(e.running for e in engines)),
                kv_usage=sum(e.kv_usage for e in engines) / len(engines) if engines else 0.0,
            )
        return out

    def client_window(self, now: float, window_s: float) -> dict[str, float]:
        """Frontend view over the window: arrivals, mean ISL/OSL of arrivals, mean TTFT and ITL of answers."""
        lo = now - window_s
        arrived = [r for r in self.records[: self._arrived] if r.request.arrival >= lo]
        done = [r for r in arrived if r.finished_at is not None]
        n = len(arrived)
        out = {"requests": float(n), "isl": 0.0, "osl": 0.0, "ttft": 0.0, "itl": 0.0}
        if n:
            out["isl"] = sum(r.request.prompt_tokens for r in arrived) / n
            out["osl"] = sum(r.request.output_tokens for r in arrived) / n
        if done:
            out["ttft"] = sum(r.ttft or 0.0 for r in done) / len(done)
            tokens = sum(r.request.output_tokens - 1 for r in done)
            if tokens > 0:
                out["itl"] = sum((r.tpot or 0.0) * (r.request.output_tokens - 1) for r in done) / tokens
        _, _, _, batch = self.stats[self.pools[-1]].rates(now, window_s)
        out["decode_batch"] = batch / max(1, len(self._ready_engines(self.pools[-1])))
        return out

    # -- routing -------------------------------------------------------------------------------------------------
    def _next_tiebreak(self) -> int:
        self._tiebreak += 1
        return self._tiebreak

    def _arrive(self, record: RequestRecord) -> None:
        request = record.request
        if request.prompt_tokens + request.output_tokens > self.fleet.context_limit:
            record.rejected = True
            self._completed += 1
            return
        if not self.fleet.disaggregated:
            record.path = "colocated"
            self._to_prefill_like(record, self.pools[0])
        elif should_disaggregate(
            request.prompt_tokens, self.fleet.disaggregate_min_prompt_tokens, self._ready_engines("prefill")
        ):
            record.path = "pd"
            self._to_prefill_like(record, "prefill")
        else:
            record.path = "direct"
            self._to_decode(record, None)

    def _to_prefill_like(self, record: RequestRecord, pool: str) -> None:
        """Send to a prefill (PD) or colocated instance, preferring the one that holds the prompt's prefix."""
        engines = self._ready_engines(pool)
        request = record.request
        hashes = record.prefix if self.fleet.prefix_affinity else ()
        owner = self.affinity.lookup(hashes) if hashes else None
        engine = choose_prefill(engines, set(), owner, self._next_tiebreak())
        if engine is None:
            self.backlog[pool].append((record, None))
            return
        if hashes:
            self.affinity.record(hashes, engine.name)
        output = 1 if pool == "prefill" else request.output_tokens
        seq = SimSeq(record, self.now, request.prompt_tokens, output, prefix=record.prefix)
        engine.inflight += 1
        self._schedule_engine(engine, engine.submit(seq, self.now))

    def _to_decode(self, record: RequestRecord, prefill: SimEngine | None) -> None:
        """Start the decode stage: a KV pull after a remote prefill, or a whole request on a decode instance."""
        engines = self._ready_engines("decode")
        if prefill is None:
            engine = choose_direct_decode(engines, set(), self._next_tiebreak())
            locality = ""
        else:
            engine, locality = choose_decode(engines, prefill, self.fleet.locality, set(), self._next_tiebreak())
        if engine is None:
            self.backlog["decode"].append((record, prefill))
            return
        request = record.request
        engine.inflight += 1
        if prefill is None:
            seq = SimSeq(record, self.now, request.prompt_tokens, request.output_tokens, prefix=record.prefix)
            self._schedule_engine(engine, engine.submit(seq, self.now))
            return
        intra, cross = self.fleet.links
        link = transfer_link(prefill.rack, engine.rack, intra, cross)
        seconds = kv_transfer_time(request.prompt_tokens * self.fleet.kv_bytes_per_token, link)
        record.kv_transfer_s = seconds
        record.locality = locality
        engine.pulling += 1
        self._push(self.now + seconds, _KV, (record, engine))

    def _kv_landed(self, record: RequestRecord, engine: SimEngine) -> None:
        engine.pulling -= 1
        request = record.request
        # vLLM caches the pulled blocks as it does computed ones, so the decode's prefix cache warms on PD requests
        prompt, output = request.prompt_tokens, request.output_tokens
        seq = SimSeq(record, self.now, prompt, output, cached=prompt, prefix=record.prefix)
        self._schedule_engine(engine, engine.submit(seq, self.now))

    def _drain_backlog(self, pool: str) -> None:
        waiting, self.backlog[pool] = self.backlog[pool], []
        for record, prefill in waiting:
            if pool == "decode" and self.fleet.disaggregated:
                self._to_decode(record, prefill)
            else:
                self._to_prefill_like(record, pool)

    # -- engine events -------------------------------------------------------------------------------------------
    def _step(self, engine: SimEngine) -> None:
        first, finished, end = engine.step_done(self.now)
        self._schedule_engine(engine, end)
        role_prefill = engine.pool == "prefill"
        for seq in first:
            if not role_prefill:
                record = seq.request
                record.ttft = self.now - record.request.arrival
        for seq in finished:
            engine.inflight -= 1
            record = seq.request
            if role_prefill:
                self._to_decode(record, engine)
            else:
                record.finished_at = self.now
                out = record.request.output_tokens
                record.tpot = (self.now - seq.first_token_at) / (out - 1) if out > 1 else 0.0
                self._completed += 1
        if engine.draining:
            for replica in self.replicas[engine.pool]:
                if replica.engine is engine:
                    self._retire_if_drained(replica)

    # -- main loop -----------------------------------------------------------------------------------------------
    def run(self, max_events: int | None = None) -> SimResult:
        """Run until every request finished (or `max_events`); returns the raw result."""
        initial = self.policy.initial(self.fleet)
        for pool in self.pools:
            self._add_replicas(pool, max(self._min_replicas(pool), initial.get(pool, 1)), ready_now=True)
            self._record_sizes(pool)
        horizon = self.trace[-1].arrival if self.trace else 0.0
        if self.policy.interval_s:
            self._push(max(WARMUP_S, self.policy.interval_s), _TICK, None)
        self._push(SNAPSHOT_S, _SNAP, None)
        budget = max_events if max_events is not None else 200 * len(self.trace) + 100_000
        heap = self._heap
        records = self.records
        n = len(records)
        while self._completed < n and self.events < budget:
            next_arrival = records[self._arrived].request.arrival if self._arrived < n else float("inf")
            if heap and heap[0][0] < next_arrival:
                time, _, kind, payload, version = heapq.heappop(heap)
                self.now = time
                self.events += 1
                if kind in (_STEP, _KV, _READY):
                    self._progress_at = time
                if kind == _STEP:
                    if payload.version == version and payload.busy:  # type: ignore[union-attr]
                        self._step(payload)  # type: ignore[arg-type]
                elif kind == _KV:
                    self._kv_landed(*payload)  # type: ignore[misc]
                elif kind == _READY:
                    self._become_ready(payload)  # type: ignore[arg-type]
                elif kind == _TICK:
                    self._tick()
                else:
                    for stats in self.stats.values():
                        stats.snapshot(self.now)
                    if self._arrived == n and self.now - self._progress_at > STALL_S:
                        self.stalled = self._stall_reason()
                        break
                    self._push(self.now + SNAPSHOT_S, _SNAP, None)
            elif self._arrived < n:
                self.now = next_arrival
                self.events += 1
                record = records[self._arrived]
                self._arrived += 1
                self._progress_at = next_arrival
                self._arrive(record)
            else:
                break
        if not self.stalled and self._completed < n:
            self.stalled = f"event budget of {budget} spent with {n - self._completed} requests unfinished"
        return SimResult(
            self.policy.name,
            self.fleet,
            self.records,
            self.all_replicas,
            self.timeline,
            horizon,
            self.now,
            self.events,
            self.decisions,
            dict(self.denied),
            self.stalled,
            self.policy.notes(),
        )

    def _stall_reason(self) -> str:
        """Why nothing moves: the pools whose requests wait, and the replicas each holds."""
        waiting = [
            f"{pool}: {len(queue)} waiting, {len(self._active(pool))} replicas"
            for pool, queue in self.backlog.items()
            if queue
        ]
        return (
            f"no progress for {STALL_S:.0f} s with {len(self.records) - self._completed} requests unfinished "
            f"({'; '.join(waiting) or 'none waiting at the router'})"
        )

    def _become_ready(self, replica: Replica) -> None:
        if replica.removed_at is not None:
            return
        replica.ready = True
        self._record_sizes(replica.engine.pool)
        self._drain_backlog(replica.engine.pool)

    def _tick(self) -> None:
        targets = self.policy.decide(self.now, self)
        self.decisions.append((self.now, dict(targets)))
        for pool, target in targets.items():
            if target != self.desired(pool):
                self.scale(pool, target)
        self._push(self.now + (self.policy.interval_s or 0.0), _TICK, None)
