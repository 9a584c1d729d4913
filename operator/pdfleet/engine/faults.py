"""Fault switches for tests: set from CLI flags at start and changed at run time via POST /internal/faults."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass
class Faults:
    """What to break. Counters are consumed one failure at a time; the rest hold until changed."""

    fail_kv_source: int = 0  # the next N KV pulls served by this instance (as prefill) fail
    fail_kv_pull: int = 0  # the next N KV pulls made by this instance (as decode) fail
    hang: bool = False  # requests are accepted and never answered (released when switched off)
    crash_after_tokens: int | None = None  # the process exits abruptly once a request has produced K tokens
    slowdown: float = 1.0  # every modelled time is multiplied by this
    unhealthy: bool = False  # GET /health answers 503

    def update(self, changes: dict) -> None:
        """Apply a partial JSON update; unknown keys or wrong types raise ValueError and change nothing."""
        known = {f.name: f for f in fields(self)}
        staged = {}
        for key, value in changes.items():
            if key not in known:
                raise ValueError(f"unknown fault {key!r}; known: {', '.join(known)}")
            staged[key] = _coerce(key, value)
        for key, value in staged.items():
            setattr(self, key, value)

    def take_kv_source_failure(self) -> bool:
        """True (and one fewer pending) when the next served KV pull must fail."""
        if self.fail_kv_source > 0:
            self.fail_kv_source -= 1
            return True
        return False

    def take_kv_pull_failure(self) -> bool:
        """True (and one fewer pending) when the next KV pull this instance makes must fail."""
        if self.fail_kv_pull > 0:
            self.fail_kv_pull -= 1
            return True
        return False

    def as_dict(self) -> dict:
        """JSON view for GET /internal/faults."""
        return asdict(self)


def _coerce(key: str, value: object) -> object:
    if key in ("hang", "unhealthy"):
        if not isinstance(value, bool):
            raise ValueError(f"{key} must be true or false")
        return value
    if key == "slowdown":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError("slowdown must be a positive number")
        return float(value)
    if key == "crash_after_tokens" and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key} must be a non-negative integer")
    return value
