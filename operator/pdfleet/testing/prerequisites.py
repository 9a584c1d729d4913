"""What a test does when a binary it needs is missing: skip on a developer's machine, fail in CI (env CI set), where
everything must run."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any, NoReturn

import pytest

from pdfleet.localfleet.controlplane import MissingBinariesError
from pdfleet.localfleet.harness import LocalFleet
from pdfleet.localfleet.prometheus import prometheus_binary


def missing_prerequisite(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"CI must run this test: {reason}")
    pytest.skip(reason)


@contextlib.contextmanager
def running_local_fleet(**options: Any) -> Iterator[LocalFleet]:
    """A started LocalFleet(**options), stopped on exit; a missing control plane or Prometheus is a missing
    prerequisite (skip locally, fail in CI)."""
    if prometheus_binary() is None:
        missing_prerequisite("prometheus binary not found (apt-get install prometheus, or ./dev setup)")
    local = LocalFleet(**options)
    try:
        local.start()
    except MissingBinariesError as error:
        missing_prerequisite(str(error))
    try:
        yield local
    finally:
        local.stop()
