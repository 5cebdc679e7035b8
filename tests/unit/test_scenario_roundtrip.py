"""Specs built in Python meet the same rules as files, and every spec writes back to a file that loads equal."""

import dataclasses
from pathlib import Path

import pytest

from harness.runspec import GraphSpec, KVWrite, Mode, Outcome, RunSpec
from harness.scenario import (
    Expectation,
    ScenarioSpec,
    check_scenario,
    load_all,
    load_scenario,
    scenario_toml,
)
from harness.scenario.spec import BackendExpectation
from harness.serving.model import model_spec
from harness.serving.pool import PoolSpec
from harness.serving.timeline import RequestSpec, TimelineSpec

LIBRARY = Path(__file__).resolve().parents[2] / "scenarios"


def _library():
    specs, errors = load_all([LIBRARY])
    assert not errors
    return specs


# the name with hyphens: `pytest -k swa_prefill` selects the scenario family's items, not this test too
@pytest.mark.parametrize("spec", _library(), ids=lambda s: s.name.replace("_", "-"))
def test_every_library_scenario_round_trips_through_the_writer(spec, tmp_path):
    path = tmp_path / f"{spec.name}.toml"
    path.write_text(scenario_toml(spec))
    assert load_scenario(path) == dataclasses.replace(spec, path=path)


def _spec(**changes) -> ScenarioSpec:
    base = ScenarioSpec(
        name="py_built", path=Path("py_built.toml"), description="built in Python", tags=("fuzz",),
        model=model_spec("gpt-oss-mini"), pool=PoolSpec(full_size=64, swa_size=32),
        timeline=TimelineSpec(requests=(RequestSpec(rid="a", prompt_len=5, output_len=3),), seed=3),
        graphs=GraphSpec(), modes=(Mode.EAGER, Mode.FULL), designs=("translate",), backends=("torch_native",),
        kv_write=KVWrite.PLAIN, faults=(),
        expectations=(Expectation(design="translate", verdict=Outcome.MATCH, why="re-translates every layer"),),
    )
    return dataclasses.replace(base, **changes)


def test_a_sound_python_built_spec_has_no_problems_and_round_trips(tmp_path):
    spec = _spec(expectations=(Expectation(
        design="translate", verdict=Outcome.MATCH, by_mode=((Mode.FULL, Outcome.DIVERGE),), why="why \"quoted\"",
        by_backend=(BackendExpectation(backend="torch_native", verdict=Outcome.ERROR, why="differs \u2028 here"),),
    ),))
    assert check_scenario(spec) == []
    path = tmp_path / "py_built.toml"
    path.write_text(scenario_toml(spec))
    assert load_scenario(path) == dataclasses.replace(spec, path=path)


def test_a_python_built_spec_is_checked_by_the_rules_a_file_is_checked_by(tmp_path):
    bad = _spec(
        pool=PoolSpec(full_size=1, swa_size=32, kv_dtype="int4"),
        timeline=TimelineSpec(requests=(RequestSpec(rid="a", prompt_len=5, abort=0),
                                        RequestSpec(rid="a", prompt_len=90)), seed=-1),
        graphs=GraphSpec(decode_buckets=(4, 4)), faults=("no_such_fault",),
    )
    found = {str(p) for p in check_scenario(bad)}
    expected = {
        "pool.full_size: expected an integer from 2 to 1048576, got 1",
        "pool.kv_dtype: expected one of 'float32', 'bfloat16', 'float16', 'fp8_e4m3', got 'int4'",
        "timeline.seed: expected an integer from 0 to 9223372036854775807, got -1",
        "timeline.requests[0].abort: must come after arrive (got 0 <= 0)",
        "timeline.requests[1].rid: duplicate rid 'a'; requests[0] has it",
        "timeline.requests[1]: needs 90 positions, pool.max_context_len is 64",
        "graphs.decode_buckets[1]: duplicate of decode_buckets[0] (4)",
    }
    assert expected <= found, expected - found
    assert any(p.startswith("run.faults[0]: expected one of") for p in found)
    # the same rules reached through a file
    path = tmp_path / "py_built.toml"
    path.write_text(scenario_toml(bad))
    with pytest.raises(Exception) as err:
        load_scenario(path)
    file_found = {line.split(": ", 1)[1] for line in err.value.problems}
    assert expected <= file_found, expected - file_found


def test_run_spec_problems_use_the_same_rules():
    spec = RunSpec(model=dataclasses.replace(model_spec("all-swa"), head_dim=15), pool=PoolSpec(full_size=8, swa_size=8),
                   timeline=TimelineSpec(requests=(RequestSpec(rid="a", prompt_len=3),)), kv_write=KVWrite.FUSED_FP8,
                   faults=frozenset({"nope"}))
    found = {str(p) for p in spec.problems()}
    assert "model.head_dim: expected an even number for RoPE, got 15" in found
    assert "kv_write: 'fused_fp8' needs pool.kv_dtype = 'fp8_e4m3', got 'float32'" in found
    assert any(p.startswith("faults: unknown fault 'nope'") for p in found)
