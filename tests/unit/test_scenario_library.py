"""The scenario library itself: it loads, and it covers what the harness promises to catch."""

import re
from pathlib import Path

import pytest

from harness.backends.registry import backend_class
from harness.scenario import load_all
from harness.scenario.spec import DEFAULT_BACKENDS
from harness.serving.faults import FAULTS, Component
from harness.serving.model import PRESETS

ROOT = Path(__file__).resolve().parents[2] / "scenarios"
FAMILIES = ("swa_prefill_", "swa_decode_", "swa_mixed_", "swa_spec_", "swa_fp8_", "swa_evict_", "swa_paged_",
            "swa_prefix_")


@pytest.fixture(scope="module")
def library():
    specs, errors = load_all([ROOT])
    assert not errors, "\n".join(str(e) for e in errors)
    return specs


def test_library_has_at_least_fifteen_scenarios_in_named_families(library):
    assert len(library) >= 15
    for spec in library:
        assert spec.name.startswith(FAMILIES), f"{spec.name}: not in a -k selectable family"
    for family in FAMILIES:
        assert any(s.name.startswith(family) for s in library), f"no {family}* scenario"


def test_every_fault_is_flagged_somewhere_and_matches_without_it(library):
    # a patch on the installed SGLang is flagged by the SGLang target's scenarios (test_fault_catalog.py)
    for fault in (f for f, spec in FAULTS.items() if spec.patch is None and spec.masked_by is None):
        flagged = [
            (s.name, e.design)
            for s in library if fault in s.faults
            for e in s.expectations
            if e.without_faults == "match" and any(e.for_mode(m) in ("diverge", "error", "invariant") for m in s.modes)
        ]
        assert flagged, f"no scenario flags {fault} and expects a match once it is switched off"


def test_a_masked_fault_is_carried_by_a_scenario_where_every_design_matches_with_it(library):
    masked = [f for f, spec in FAULTS.items() if spec.masked_by is not None]
    assert masked, "no masked fault: drop this test and the field"
    for fault in masked:
        carried = [s for s in library if fault in s.faults]
        assert carried, f"no scenario carries {fault}, so nothing shows what masks it"
        for s in carried:
            for e in s.expectations:
                assert all(e.for_mode(m) == "match" for m in s.modes if m in FAULTS[fault].modes), (s.name, e.design)


def test_every_scenario_names_the_real_fixes_it_stands_for(library):
    shape = re.compile(r"^(SGLang|vLLM|TensorRT-LLM|PyTorch|FlashInfer) (PR|issue) \d+$")
    for spec in library:
        assert spec.references, f"{spec.name}: no references"
        for ref in spec.references:
            assert shape.match(ref), f"{spec.name}: reference {ref!r} is not 'Project PR|issue N'"


def test_every_model_preset_is_exercised(library):
    assert {s.model.name for s in library} >= set(PRESETS)


def test_every_expectation_says_why(library):
    for spec in library:
        for exp in spec.expectations:
            assert len(exp.why.split()) >= 3, f"{spec.name}: expect.{exp.design}.why is not an explanation"


def test_library_covers_the_promised_workloads(library):
    kv = {s.pool.kv_dtype for s in library}
    assert {"float32", "bfloat16", "float16", "fp8_e4m3"} <= kv
    assert any(s.kv_write == "fused_fp8" for s in library)
    assert any(s.timeline.draft_steps > 0 for s in library)
    assert any(s.timeline.chunk_size for s in library)
    assert any(any(r.abort is not None for r in s.timeline.requests) for s in library)
    assert {"eager", "full", "piecewise"} <= {m for s in library for m in s.modes}


def test_every_scenario_runs_both_cpu_backends_unless_only_one_has_its_faults_switch(library):
    for spec in library:
        # GPU backends (FlashInfer's) are added where a scenario states what they give; the CPU ones are the rule
        cpu = tuple(b for b in spec.backends if "cpu" in backend_class(b).devices)
        if cpu == DEFAULT_BACKENDS:
            continue
        lacking = {f for f in spec.faults if FAULTS[f].acts_on is Component.ATTENTION_BACKEND
                   and any(f not in backend_class(b).known_faults for b in DEFAULT_BACKENDS)}
        assert lacking, f"{spec.name}: lists run.backends without a backend fault that needs it"
        able = tuple(b for b in DEFAULT_BACKENDS if lacking <= backend_class(b).known_faults)
        assert cpu == able, f"{spec.name}: runs {cpu} on the CPU, but {able} have the switches"
