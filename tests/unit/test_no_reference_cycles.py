"""A run's objects die by reference counting: runners, graphs and their tapes, the stack and its prefix cache.

The worker children run each task without the cyclic collector (``workers.collector_between_tasks``); a
reference cycle through a runner would leave its whole object graph (every tape of every graph) to the one
collection after the task, and make the collector's passes during a run cost a tenth of its time again.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

from harness.check.matrix.case import Selection, cases
from harness.check.run.drive import execute
from harness.scenario.loader import load_scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
# a radix tree's nodes point at their parent and their children: small cycles that hold nothing of the run
_ALLOWED = {"harness.serving.prefix_cache._Node"}


# ids without the scenarios' names: ``-k swa_prefill`` selects scenario items only (tests/plugin/test_front_door.py)
@pytest.mark.parametrize(("scenario", "mode"), [
    pytest.param("swa_prefill_all_swa", "full", id="prefill-full"),
    pytest.param("swa_prefill_all_swa", "piecewise", id="prefill-piecewise"),
    pytest.param("swa_prefix_multi_turn", "full", id="radix-full"),
    pytest.param("swa_prefix_multi_turn", "piecewise", id="radix-piecewise"),
])
def test_a_run_leaves_no_cyclic_garbage_of_the_harness(scenario, mode):
    spec = load_scenario(SCENARIOS / f"{scenario}.toml")
    (case,) = [c for c in cases(spec, Selection(modes=(mode,), designs=("translate",), backends=("torch_native",)))
               if c.with_faults]
    run = case.run_spec()
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        result = execute(run)
        assert result.error is None
        del result
        gc.collect()
        garbage = [o for o in gc.garbage if isinstance(o, torch.Tensor)
                   or (type(o).__module__.startswith("harness.")
                       and f"{type(o).__module__}.{type(o).__qualname__}" not in _ALLOWED)]
        kinds = sorted({f"{type(o).__module__}.{type(o).__qualname__}" for o in garbage})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if enabled:
            gc.enable()
    assert kinds == []
