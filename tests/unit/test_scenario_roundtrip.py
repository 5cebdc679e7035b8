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


def _run_spec(**changes) -> RunSpec:
    base = RunSpec(model=model_spec("gpt-oss-mini"), pool=PoolSpec(full_size=64, swa_size=32, page_size=4,
                                                                   free_order="fifo"),
                   timeline=TimelineSpec(requests=(RequestSpec(rid="a", prompt_len=9, output_len=4),
                                                   RequestSpec(rid="b", arrive=1, prompt_len=3, output_len=6)), seed=5),
                   design="memoized", mode=Mode.FULL, graphs=GraphSpec(decode_buckets=(1, 2)))
    return dataclasses.replace(base, **changes)


def test_a_generated_run_becomes_a_scenario_file_that_round_trips_and_loads(tmp_path):
    from harness.scenario import scenario_of

    spec = scenario_of(_run_spec(), name="fuzz_7", description="found by a fuzzer", designs=("memoized", "plan"),
                       modes=("eager", "full"))
    assert [(e.design, e.verdict) for e in spec.expectations] == [("memoized", "match"), ("plan", "match")]
    assert "declared sound" in spec.expectations[0].why and check_scenario(spec) == []
    text = scenario_toml(spec)
    assert '[serving]\nfree_order = "fifo"' in text and "free_order" not in text.split("[pool]")[1].split("[")[0]
    path = tmp_path / "fuzz_7.toml"
    path.write_text(text)
    assert load_scenario(path) == dataclasses.replace(spec, path=path)
    assert spec.run_spec(design="memoized", mode="full", backend="torch_native") == _run_spec()


def test_a_generated_scenario_leaves_a_known_wrong_design_and_a_faulted_run_to_the_caller():
    from harness.scenario import scenario_of

    with pytest.raises(ValueError, match="'stale_state': it is declared known-wrong"):
        scenario_of(_run_spec(design="stale_state"), name="g", description="d")
    with pytest.raises(ValueError, match="'translate': the run has faults"):
        scenario_of(_run_spec(design="translate", faults=frozenset({"no_zero_swa_pad"})), name="g", description="d")
    given = Expectation(design="stale_state", verdict=Outcome.DIVERGE, why="reads a stale attribute")
    spec = scenario_of(_run_spec(design="stale_state"), name="g", description="d", expectations=(given,))
    assert spec.expectations == (given,)
    with pytest.raises(ValueError, match="runner"):
        scenario_of(_run_spec(runner="x.y:Z"), name="g", description="d")


def test_the_serving_table_round_trips_a_stack_by_name_and_by_import_path(tmp_path):
    for stack in ("sglang", "some_pkg.stacks:MyStack"):
        spec = _spec(serving=stack)
        path = tmp_path / "py_built.toml"
        path.write_text(scenario_toml(spec))
        assert f'[serving]\nstack = "{stack}"' in path.read_text()
        # the optional install and the third-party module are not imported to load the file
        assert load_scenario(path) == dataclasses.replace(spec, path=path)
