"""Fixtures of the report tests: the views of one real small run, shared by the whole session."""

from __future__ import annotations

import pytest

from harness.report.views import CaseView

from ._samples import run_samples


@pytest.fixture(scope="session")
def sample_views() -> tuple[CaseView, ...]:
    """Every run of the four samples (a second or two on one core; the plugin keeps torch on one thread)."""
    return tuple(run_samples())
