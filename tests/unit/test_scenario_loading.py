"""Scenario files: parsing, defaults, every class of validation problem, the dry run, discovery."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest

from harness.check.case import cases
from harness.check.matrix import run_case
from harness.runspec import GraphSpec, Mode, RunSpec
from harness.scenario import (
    Expectation,
    ScenarioError,
    ScenarioSpec,
    discover,
    load_all,
    load_scenario,
)
from harness.serving.designs import DEFAULT_DESIGNS, DESIGNS, OPT_IN_DESIGNS
from harness.serving.model import PRESETS
from harness.serving.pool import PoolSpec
from harness.serving.timeline import RequestSpec, TimelineSpec

# A valid scenario in parts; a test replaces or drops (None) a part to provoke one problem.
PARTS = {
    "head": 'description = "two requests past the window"\n',
    "model": '[model]\npreset = "gpt-oss-mini"\n',
    "pool": "[pool]\nfull_size = 64\nswa_size = 32\n",
    "graphs": "",
    "timeline": (
        "[timeline]\nchunk_size = 8\n"
        '[[timeline.requests]]\nrid = "a"\nprompt_len = 9\noutput_len = 4\n'
        "[[timeline.requests]]\narrive = 2\nprompt_len = 3\noutput_len = 5\n"
    ),
    "run": '[run]\ndesigns = ["translate"]\n',
    "expect": '[expect.translate]\nverdict = "match"\nwhy = "re-translates in every layer"\n',
}


def write(tmp_path: Path, name: str = "case", **parts: str | None) -> Path:
    merged = {**PARTS, **parts}
    path = tmp_path / f"{name}.toml"
    path.write_text("\n".join(text for text in merged.values() if text))
    return path


def problems_of(path: Path) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    err = info.value
    assert err.path == path
    assert str(err).splitlines() == list(err.problems)
    assert all(line.startswith(f"{path}: ") for line in err.problems), err.problems
    return list(err.problems)


def assert_problem(path: Path, *fragments: str) -> list[str]:
    """Some problem line contains the key path and every fragment; returns all lines for further checks."""
    found = problems_of(path)
    assert any(all(f in line for f in fragments) for line in found), found
    return found


# ---- a valid file ---------------------------------------------------------------------------------------


def test_minimal_file_loads_with_defaults(tmp_path):
    spec = load_scenario(write(tmp_path, name="minimal"))
    assert isinstance(spec, ScenarioSpec)
    assert spec.name == "minimal" and spec.path == tmp_path / "minimal.toml"
    assert spec.description == "two requests past the window"
    assert spec.tags == ()
    assert spec.model == PRESETS["gpt-oss-mini"]
    assert spec.pool == PoolSpec(full_size=64, swa_size=32)
    assert spec.graphs == GraphSpec()
    assert spec.modes == tuple(Mode)
    assert spec.designs == ("translate",)
    assert spec.backends == ("torch_native", "torch_gather")
    assert spec.kv_write == "plain"
    assert spec.faults == ()
    assert spec.timeline == TimelineSpec(
        requests=(
            RequestSpec(rid="a", prompt_len=9, output_len=4),
            RequestSpec(rid="r1", arrive=2, prompt_len=3, output_len=5),  # default rid is r{index}
        ),
        chunk_size=8,
    )
    assert spec.expectations == (
        Expectation(design="translate", verdict="match", why="re-translates in every layer"),
    )


def test_full_file_loads_overrides_and_builds_run_specs(tmp_path):
    path = write(
        tmp_path,
        head='description = "d"\ntags = ["decode", "padding"]\n',
        model='[model]\npreset = "gemma-mini"\nwindow = 5\nlayer_pattern = ["swa", "full"]\nrope_theta = 500\n',
        pool='[pool]\nfull_size = 64\nswa_size = 32\nkv_dtype = "fp8_e4m3"\nmax_context_len = 32\n',
        graphs='[graphs]\nmodes = ["eager", "full"]\ndecode_buckets = [1, 4]\nprefill_buckets = [16]\n'
        'capture = "on_demand"\n',
        run='[run]\ndesigns = ["translate", "stale_state", "harness.serving.designs:metadata"]\nkv_write = "fused_fp8"\n'
        'faults = ["no_zero_swa_pad"]\n',
        expect='[expect.translate]\nverdict = "match"\nwhy = "w"\n'
        '[expect.stale_state]\nverdict = "match"\nfull = "diverge"\nwithout_faults = "match"\nwhy = "w"\n'
        '[expect."harness.serving.designs:metadata"]\nverdict = "error"\nwhy = "w"\n',
    )
    spec = load_scenario(path)
    assert spec.tags == ("decode", "padding")
    assert (spec.model.name, spec.model.window, spec.model.head_dim) == ("gemma-mini", 5, 32)
    assert spec.model.layer_pattern == ("swa", "full")
    assert spec.model.rope_theta == 500.0 and isinstance(spec.model.rope_theta, float)
    assert spec.graphs == GraphSpec(decode_buckets=(1, 4), prefill_buckets=(16,), capture="on_demand")
    assert spec.modes == ("eager", "full")
    assert spec.designs == ("translate", "stale_state", "harness.serving.designs:metadata")
    assert [e.design for e in spec.expectations] == list(spec.designs)
    stale = spec.expectation("stale_state")
    assert stale.by_mode == (("full", "diverge"),) and stale.without_faults == "match"

    run = spec.run_spec(design="stale_state", mode="full", backend="torch_native")
    assert isinstance(run, RunSpec)
    assert (run.design, run.mode, run.backend, run.engine, run.device) == (
        "stale_state", "full", "torch_native", "tape", "cpu"
    )
    assert run.faults == frozenset({"no_zero_swa_pad"})
    assert (run.model, run.pool, run.timeline, run.graphs, run.kv_write) == (
        spec.model, spec.pool, spec.timeline, spec.graphs, "fused_fp8"
    )
    bare = spec.run_spec(design="stale_state", mode="full", backend="torch_native", engine="cuda",
                         device="cuda", with_faults=False)
    assert bare.faults == frozenset() and (bare.engine, bare.device) == ("cuda", "cuda")
    with pytest.raises(ValueError, match="does not run mode 'piecewise'"):
        spec.run_spec(design="translate", mode="piecewise", backend="torch_native")
    # another design over the same scenario is a cross-check the caller judges (python -m harness run --design)
    assert spec.run_spec(design="memoized", mode="eager", backend="torch_native").design == "memoized"
    with pytest.raises(KeyError, match="memoized"):
        spec.expectation("memoized")


def test_default_designs_are_the_rules_of_the_review_and_both_cpu_backends_run(tmp_path):
    expect = "".join(f'[expect.{d}]\nverdict = "match"\nwhy = "w"\n' for d in DEFAULT_DESIGNS)
    spec = load_scenario(write(tmp_path, run=None, expect=expect))
    assert spec.designs == DEFAULT_DESIGNS == tuple(d for d in DESIGNS if d not in OPT_IN_DESIGNS)
    assert "untranslated" in OPT_IN_DESIGNS
    assert spec.backends == ("torch_native", "torch_gather")


def test_expectation_for_mode():
    exp = Expectation(design="d", verdict="match", by_mode=(("full", "diverge"), ("piecewise", "error")), why="w")
    assert exp.for_mode("full") == "diverge"
    assert exp.for_mode("piecewise") == "error"
    assert exp.for_mode("eager") == "match"


# ---- syntax, keys, types ----------------------------------------------------------------------------------


def test_toml_syntax_error_has_line_and_column(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text('description = "d"\n[model]\npreset = = "gpt-oss-mini"\n')
    found = problems_of(path)
    assert len(found) == 1
    assert found[0].startswith(f"{path}: line 3, column 10: invalid TOML: ")


def test_unreadable_file_is_a_problem_not_a_traceback(tmp_path):
    assert_problem(tmp_path / "absent.toml", "cannot read the file")
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(b'description = "caf\xe9"\n')
    assert_problem(bad, "not UTF-8 text")


def test_unknown_keys_at_every_level(tmp_path):
    path = write(
        tmp_path,
        head='description = "d"\ncomment = "x"\n',
        model='[model]\npreset = "gpt-oss-mini"\nwindw = 4\nname = "x"\n',
        timeline='[timeline]\n[[timeline.requests]]\nprompt_len = 3\nprmpt = 2\n',
        expect='[expect.translate]\nverdict = "match"\nwhy = "w"\nverdit = "x"\n',
    )
    found = problems_of(path)
    assert f"{path}: comment: unknown key; expected one of description, tags, references, model" in "\n".join(found)
    assert any(line.startswith(f"{path}: model.windw: unknown key; expected one of preset,") and "window" in line
               for line in found), found
    # the preset's name is not a model override
    assert any(line.startswith(f"{path}: model.name: unknown key") for line in found), found
    assert any(line.startswith(f"{path}: timeline.requests[0].prmpt: unknown key") for line in found), found
    assert any(line.startswith(f"{path}: expect.translate.verdit: unknown key") for line in found), found


def test_bool_is_not_an_integer(tmp_path):
    # true would pass as the integer 1 if booleans were not told apart
    path = write(tmp_path, pool="[pool]\nfull_size = 64\nswa_size = 32\nmax_running_requests = true\n",
                 timeline="[timeline]\nseed = false\n[[timeline.requests]]\nprompt_len = true\n")
    text = "\n".join(problems_of(path))
    assert f"{path}: pool.max_running_requests: expected an integer, got boolean true" in text
    assert f"{path}: timeline.seed: expected an integer, got boolean false" in text
    assert f"{path}: timeline.requests[0].prompt_len: expected an integer, got boolean true" in text


def test_wrong_types(tmp_path):
    path = write(
        tmp_path,
        head='description = 3\ntags = "decode"\npool = 3\n',
        model='[model]\npreset = "gpt-oss-mini"\nwindow = "8"\nlayer_pattern = "swa"\n',
        pool=None,
    )
    text = "\n".join(problems_of(path))
    assert f"{path}: description: expected a non-empty string, got integer 3" in text
    assert f"{path}: tags: expected an array, each item a non-empty string, got string 'decode'" in text
    assert f"{path}: model.window: expected an integer, got string '8'" in text
    assert f"{path}: model.layer_pattern: expected an array, each item a string, got string 'swa'" in text
    assert f"{path}: pool: expected a table, got integer 3" in text


def test_missing_required_keys(tmp_path):
    path = write(tmp_path, head="", model="[model]\nwindow = 4\n", pool=None,
                 timeline="[timeline]\n[[timeline.requests]]\noutput_len = 2\n")
    text = "\n".join(problems_of(path))
    assert f"{path}: description: missing required key" in text
    assert f"{path}: model.preset: missing required key; expected one of 'gpt-oss-mini'" in text
    assert f"{path}: pool: missing required table" in text
    assert f"{path}: timeline.requests[0].prompt_len: missing required key; expected an integer" in text


def test_timeline_needs_requests(tmp_path):
    assert_problem(write(tmp_path, timeline="[timeline]\nseed = 1\n"), "timeline.requests: missing required key")
    assert_problem(write(tmp_path, timeline="[timeline]\nrequests = []\n"),
                   "timeline.requests: expected at least one [[timeline.requests]] table, got an empty array")


def test_values_out_of_range(tmp_path):
    path = write(
        tmp_path,
        pool="[pool]\nfull_size = 64\nswa_size = 1\nmax_running_requests = 0\n",
        graphs="[graphs]\ndecode_buckets = [1, 0]\nprefill_buckets = []\n",
        timeline="[timeline]\nchunk_size = 0\ndraft_steps = -1\n"
        "[[timeline.requests]]\nprompt_len = 0\noutput_len = -2\narrive = -1\n",
        expect='[expect.translate]\nverdict = "match"\nwhy = "  "\n',
    )
    text = "\n".join(problems_of(path))
    assert f"{path}: pool.swa_size: expected an integer from 2 to 1048576, got 1" in text
    assert f"{path}: pool.max_running_requests: expected an integer from 1 to" in text
    assert f"{path}: graphs.decode_buckets[1]: expected an integer from 1 to 1048576, got 0" in text
    assert f"{path}: graphs.prefill_buckets: expected at least one bucket" in text
    assert f"{path}: timeline.chunk_size: expected an integer from 1 to" in text
    assert f"{path}: timeline.draft_steps: expected an integer from 0 to" in text
    assert f"{path}: timeline.requests[0].prompt_len: expected an integer from 1 to" in text
    assert f"{path}: timeline.requests[0].output_len: expected an integer from 0 to" in text
    assert f"{path}: timeline.requests[0].arrive: expected an integer from 0 to" in text
    assert f"{path}: expect.translate.why: expected a non-empty string" in text


def test_duplicates_in_lists(tmp_path):
    path = write(tmp_path, graphs='[graphs]\nmodes = ["eager", "full", "eager"]\n')
    assert_problem(path, "graphs.modes[2]: duplicate of graphs.modes[0] ('eager')")


# ---- registries ---------------------------------------------------------------------------------------------


def test_unknown_registry_names(tmp_path):
    path = write(
        tmp_path,
        model='[model]\npreset = "llama-mini"\n',
        pool='[pool]\nfull_size = 64\nswa_size = 32\nkv_dtype = "int4"\n',
        graphs='[graphs]\nmodes = ["eager", "fulll"]\ncapture = "lazy"\n',
        run='[run]\ndesigns = ["translate", "magic"]\nbackends = ["flashinfr"]\nkv_write = "fused"\n'
        'faults = ["no_such_fault"]\n',
        expect='[expect.translate]\nverdict = "match"\nwhy = "w"\n[expect.magic]\nverdict = "match"\nwhy = "w"\n',
    )
    text = "\n".join(problems_of(path))
    assert (f"{path}: model.preset: expected one of 'gpt-oss-mini', 'gemma-mini', 'all-swa', 'gpt-oss-mini-bf16', "
            "'gemma-mini-fp16', got string 'llama-mini'") in text
    assert f"{path}: pool.kv_dtype: expected one of 'float32', 'bfloat16', 'float16', 'fp8_e4m3', got 'int4'" in text
    assert f"{path}: graphs.modes[1]: expected one of 'eager', 'full', 'piecewise', got 'fulll'" in text
    assert f"{path}: graphs.capture: expected one of 'startup', 'on_demand'" in text
    assert f"{path}: run.designs[1]: unknown design 'magic'" in text
    assert f"{path}: run.backends[0]: expected one of 'torch_native', 'torch_gather', 'flashinfer', 'trtllm_mha' or an import path 'package.module:Class', got 'flashinfr'" in text
    assert f"{path}: run.kv_write: expected one of 'plain', 'fused_fp8', got 'fused'" in text
    assert f"{path}: run.faults[0]: expected one of 'no_zero_swa_pad'" in text
    assert "got 'no_such_fault'" in text


def test_a_design_import_path_is_not_imported_at_load_and_fails_as_an_error_verdict(tmp_path):
    path = write(
        tmp_path,
        run='[run]\ndesigns = ["no_such_pkg_xyz.mod:fn", "harness.serving.designs:nope"]\n',
        expect='[expect."no_such_pkg_xyz.mod:fn"]\nverdict = "error"\nwhy = "w"\n'
        '[expect."harness.serving.designs:nope"]\nverdict = "error"\nwhy = "w"\n',
    )
    spec = load_scenario(path)  # the trust model: third-party code is imported when a run needs it
    assert "no_such_pkg_xyz" not in sys.modules
    result = run_case(next(c for c in cases(spec) if c.design == "no_such_pkg_xyz.mod:fn"))
    assert result.verdict.outcome == "error" and result.ok
    assert "design 'no_such_pkg_xyz.mod:fn' cannot be imported" in result.verdict.error.message


def test_fused_fp8_needs_an_fp8_pool(tmp_path):
    assert_problem(write(tmp_path, run='[run]\ndesigns = ["translate"]\nkv_write = "fused_fp8"\n'),
                   "run.kv_write: 'fused_fp8' needs pool.kv_dtype = 'fp8_e4m3', got 'float32'")


def test_model_problems_after_overrides(tmp_path):
    path = write(tmp_path, model='[model]\npreset = "gpt-oss-mini"\nnum_heads = 3\nhead_dim = 15\n'
                                 'layer_pattern = ["swa", "global"]\nvocab_size = 0\ndtype = "float64"\n')
    text = "\n".join(problems_of(path))
    assert f"{path}: model.num_heads: expected a multiple of num_kv_heads (2), got 3" in text
    assert f"{path}: model.head_dim: expected an even number for RoPE, got 15" in text
    assert f"{path}: model.layer_pattern: expected entries 'swa' or 'full', got ['global']" in text
    assert f"{path}: model.vocab_size: expected an integer from 1 to 262144, got 0" in text
    assert f"{path}: model.dtype: expected one of" in text


# ---- expectations -------------------------------------------------------------------------------------------


def test_expectation_tables_must_match_designs(tmp_path):
    path = write(
        tmp_path,
        run='[run]\ndesigns = ["translate", "memoized"]\n',
        expect='[expect.translate]\nverdict = "match"\nwhy = "w"\n[expect.metadata]\nverdict = "match"\nwhy = "w"\n',
    )
    text = "\n".join(problems_of(path))
    assert f"{path}: expect.memoized: missing table; every design in run.designs needs" in text
    assert f"{path}: expect.metadata: no such design in run.designs (translate, memoized)" in text


def test_expectation_values(tmp_path):
    path = write(
        tmp_path,
        graphs='[graphs]\nmodes = ["eager", "full"]\n',
        expect='[expect.translate]\nverdict = "pass"\npiecewise = "match"\nfull = "crash"\n'
        'without_faults = "match"\n',
    )
    text = "\n".join(problems_of(path))
    assert f"{path}: expect.translate.verdict: expected one of 'match', 'diverge', 'error', 'invariant', got 'pass'" in text
    assert f"{path}: expect.translate.full: expected one of 'match', 'diverge', 'error', 'invariant', got 'crash'" in text
    assert f"{path}: expect.translate.piecewise: mode not run; graphs.modes is eager, full" in text
    assert f"{path}: expect.translate.without_faults: only allowed when run.faults is non-empty" in text
    assert f"{path}: expect.translate.why: missing required key; expected a non-empty string" in text


# ---- impossible timelines and the dry run -------------------------------------------------------------------


def test_impossible_timelines(tmp_path):
    path = write(
        tmp_path,
        pool="[pool]\nfull_size = 64\nswa_size = 32\nmax_context_len = 16\n",
        timeline="[timeline]\nmax_steps = 20\n"
        '[[timeline.requests]]\nrid = "a"\nprompt_len = 9\n'
        '[[timeline.requests]]\nrid = "a"\nprompt_len = 3\n'
        "[[timeline.requests]]\narrive = 5\nprompt_len = 3\nabort = 3\n"
        "[[timeline.requests]]\nprompt_len = 12\noutput_len = 5\n"
        "[[timeline.requests]]\narrive = 20\nprompt_len = 1\n",
    )
    text = "\n".join(problems_of(path))
    assert f"{path}: timeline.requests[1].rid: duplicate rid 'a'; requests[0] has it" in text
    assert f"{path}: timeline.requests[2].abort: must come after arrive (got 3 <= 5)" in text
    assert f"{path}: timeline.requests[3]: needs 17 positions, pool.max_context_len is 16" in text
    assert f"{path}: timeline.requests[4].arrive: must come before timeline.max_steps (got 20 >= 20)" in text


def test_dry_run_finds_a_too_small_swa_pool(tmp_path):
    # three 9-token prompts prefilled in one batch: the third finds 1 of the 19 usable SWA slots left
    timeline = "[timeline]\n" + "[[timeline.requests]]\nprompt_len = 9\noutput_len = 2\n" * 3
    found = problems_of(write(tmp_path, pool="[pool]\nfull_size = 64\nswa_size = 20\n", timeline=timeline))
    assert found == [f"{found[0].split(': ')[0]}: pool.swa_size: too small for the timeline: "
                     "SWA KV pool: need 9 slots, 1 free of 19 (at step 0)"]
    # the same timeline fits once the SWA pool holds every prompt
    load_scenario(write(tmp_path, pool="[pool]\nfull_size = 64\nswa_size = 28\n", timeline=timeline))


def test_dry_run_finds_swa_exhaustion_after_eviction_and_other_limits(tmp_path):
    # one request decoding: eviction keeps it within the window, so a pool of window + 1 usable slots suffices
    long = "[timeline]\n[[timeline.requests]]\nprompt_len = 4\noutput_len = 40\n"
    load_scenario(write(tmp_path, pool="[pool]\nfull_size = 64\nswa_size = 10\n", timeline=long))
    assert_problem(write(tmp_path, pool="[pool]\nfull_size = 20\nswa_size = 10\n", timeline=long),
                   "pool.full_size: too small for the timeline: full KV pool: need 1 slots, 0 free of 19 (at step")
    two = "[timeline]\n" + "[[timeline.requests]]\nprompt_len = 2\noutput_len = 2\n" * 2
    assert_problem(write(tmp_path, pool="[pool]\nfull_size = 64\nswa_size = 32\nmax_running_requests = 1\n",
                         timeline=two),
                   "pool.max_running_requests: too small for the timeline: req_to_token rows")
    assert_problem(write(tmp_path, timeline="[timeline]\nmax_steps = 3\n" + long.split("\n", 1)[1]),
                   "timeline.max_steps: too small: timeline did not finish within max_steps=3")


def test_dry_run_waits_for_other_problems(tmp_path):
    # with another mistake in the file the dry run does not run, so its finding cannot bury the real one
    found = problems_of(write(tmp_path, pool="[pool]\nfull_size = 64\nswa_size = 2\n", head='description = ""\n'))
    assert len(found) == 1 and ": description: " in found[0]


def test_every_problem_of_a_file_is_listed(tmp_path):
    path = write(
        tmp_path,
        model='[model]\npreset = "gpt-oss-mini"\nwindw = 4\n',
        pool="[pool]\nfull_size = 1\nswa_size = 32\n",
        timeline="[timeline]\n[[timeline.requests]]\nprompt_len = 3\nabort = 0\n",
        run='[run]\ndesigns = ["translate"]\nfaults = ["nope"]\n',
    )
    found = problems_of(path)
    keys = [line.removeprefix(f"{path}: ").split(":")[0] for line in found]
    assert keys == ["model.windw", "pool.full_size", "timeline.requests[0].abort", "run.faults[0]"], found


def test_scenario_error_pickles(tmp_path):
    with pytest.raises(ScenarioError) as info:
        load_scenario(write(tmp_path, head=""))
    again = pickle.loads(pickle.dumps(info.value))
    assert again.path == info.value.path and again.problems == info.value.problems


# ---- discovery and loading many files -----------------------------------------------------------------------


def test_discover_expands_sorts_and_dedups(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "deep").mkdir()
    for rel in ("z.toml", "a.toml", "b/m.toml", "b/deep/c.toml", "b/notes.txt"):
        (tmp_path / rel).write_text("")
    explicit = tmp_path / "b" / "notes.txt"
    found = discover([explicit, tmp_path, tmp_path / "a.toml"])
    assert found == [
        explicit,  # a file given explicitly is kept, whatever its suffix
        tmp_path / "a.toml",
        tmp_path / "b" / "deep" / "c.toml",
        tmp_path / "b" / "m.toml",
        tmp_path / "z.toml",
    ]


def test_load_all_keeps_going_and_flags_duplicate_names(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    good = write(first, name="same")
    dup = write(second, name="same")
    bad = write(first, name="bad", model='[model]\npreset = "nope"\n')
    other = write(second, name="other")
    specs, errors = load_all([first, second])
    assert [s.path for s in specs] == [good, other]
    assert [e.path for e in errors] == [bad, dup]
    assert "model.preset" in str(errors[0])
    assert str(errors[1]) == f"{dup}: name: duplicate scenario name 'same'; already loaded from {good}"


# ---- the [serving] table ---------------------------------------------------------------------------------


def test_the_serving_table_names_a_stack_and_its_free_order(tmp_path, monkeypatch):
    for module in [m for m in sys.modules if m == "sglang" or m.startswith(("sglang.", "harness.sglang.stack"))]:
        monkeypatch.delitem(sys.modules, module)
    spec = load_scenario(write(tmp_path, graphs='[serving]\nstack = "sglang"\nfree_order = "lifo"\n'))
    assert spec.serving == "sglang" and spec.pool.free_order == "lifo"
    # neither the optional install nor the stack's module is imported to load it (the dry run's miniature)
    assert "sglang" not in sys.modules and "harness.sglang.stack" not in sys.modules
    assert spec.run_spec(design="translate", mode="eager", backend="torch_native").serving == "sglang"
    assert load_scenario(write(tmp_path, name="plain")).serving == "miniature"


def test_serving_table_problems_name_the_key_and_what_was_expected(tmp_path):
    path = write(tmp_path, graphs='[serving]\nstack = "sglnag"\nfree_order = 3\nkind = "x"\n')
    text = "\n".join(problems_of(path))
    assert (f"{path}: serving.stack: unknown serving stack 'sglnag' (did you mean 'sglang'?); known serving stacks: "
            "miniature, sglang, or an import path 'package.module:Class'") in text
    assert f"{path}: serving.free_order: expected one of 'lowest', 'fifo', 'lifo', got integer 3" in text
    assert f"{path}: serving.kind: unknown key; expected one of stack, free_order" in text
    assert_problem(write(tmp_path, name="b", graphs='[serving]\nstack = "not a name"\n'), "serving.stack",
                   "expected a serving stack's name or an import path 'package.module:Class', got 'not a name'")
    assert_problem(write(tmp_path, name="c", graphs='[serving]\nfree_order = "highest"\n'), "serving.free_order",
                   "expected one of 'lowest', 'fifo', 'lifo', got string 'highest'")
    assert_problem(write(tmp_path, name="d", pool="[pool]\nfull_size = 64\nswa_size = 32\nfree_order = \"fifo\"\n",
                         graphs='[serving]\nfree_order = "fifo"\n'), "serving.free_order: given in [pool] too")
    # the old docs' spelling, a top-level string
    assert_problem(write(tmp_path, name="e", head=PARTS["head"] + 'serving = "sglang"\n'),
                   "serving: expected a table, got string 'sglang'")
