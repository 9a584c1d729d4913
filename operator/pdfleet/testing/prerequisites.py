"""What a test does when a binary it needs is missing: skip on a developer's machine, fail in CI (env CI set), where
everything must run."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing_prerequisite(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"CI must run this test: {reason}")
    pytest.skip(reason)
