"""The model the window-groups stack serves: sliding layers of two windows (8 and 32) and full attention,
and a run of it through the stack and its backend, named by import path."""

from __future__ import annotations

from harness.runspec import RunSpec
from harness.serving.model import ModelSpec
from harness.serving.pool import PoolSpec
from harness.serving.timeline import RequestSpec, TimelineSpec

STACK = "tests.extending.window_groups.stack:WindowGroupsStack"
BACKEND = "tests.extending.window_groups.backend:WindowGroupsBackend"

THREE_WINDOWS = ModelSpec(name="three-windows", layer_pattern=("swa", "full", "swa", "swa"), window=32,
                          layer_windows=(8, None, 32, 8))
"""layers 0 and 3 see 8 keys, layer 2 sees 32 (the widest: what eviction frees by), layer 1 everything"""

TIMELINE = TimelineSpec(requests=(
    RequestSpec(rid="a", prompt_len=20, output_len=30),
    RequestSpec(rid="b", arrive=3, prompt_len=9, output_len=36),
    RequestSpec(rid="c", arrive=12, prompt_len=40, output_len=6),
), chunk_size=16, seed=5)
"""long enough that tokens leave both windows and the window groups reuse freed slots"""


def run_spec(**kw) -> RunSpec:
    """A run of the three-window model through the window-groups stack and its backend (eager)."""
    kw.setdefault("serving", STACK)
    kw.setdefault("backend", BACKEND)
    return RunSpec(model=THREE_WINDOWS, pool=PoolSpec(full_size=192, swa_size=112, max_context_len=64),
                   timeline=TIMELINE, **kw)
