"""The timeline fuzzer: its strategies make only valid scenarios, a clean design gives no false alarm in a
short budget, the known-bad configurations are found and shrunk, and a finding written as a scenario file
loads back and reproduces its verdicts. Every search is seeded and keeps its examples in memory."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from harness.check.matrix.judgement import Judgement, judge_one
import harness.fuzz
from harness.cli import main
from harness.fuzz import Finding, FuzzTarget, fuzz, signature, write_regression
from harness.fuzz.regression import replay_regression
from harness.fuzz.strategies import problems, run_specs
from harness.runspec import Mode, RunSpec
from harness.scenario import load_scenario
from harness.serving.model_spec import model_spec
from harness.serving.pool_spec import PoolSpec
from harness.serving.timeline import RequestSpec, TimelineSpec


reproduces = replay_regression


@settings(max_examples=8, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(run_specs(FuzzTarget(design="forward_batch", mode=Mode.FULL, faults=frozenset({"no_zero_swa_pad"}))))
def test_every_generated_run_is_a_valid_scenario_with_its_target(spec):
    assert problems(spec) == []
    assert (spec.design, spec.mode, spec.faults) == ("forward_batch", "full", frozenset({"no_zero_swa_pad"}))


# the false-alarm check: one sound design per mode, clean, four examples each (the same four on any machine;
# make test keeps them within about ten seconds together, make fuzz runs for longer)
@pytest.mark.parametrize("design, mode", [("forward_batch", "full"), ("translate", "piecewise"),
                                          ("metadata", "eager")])
def test_a_sound_design_without_faults_gives_no_false_alarm(design, mode):
    report = fuzz(FuzzTarget(design=design, mode=Mode(mode)), budget_s=30, max_examples=4, seed=0, database=None)
    assert report.tried == 4 and report.stopped == "Hypothesis ended its search"
    assert not report.findings, "\n".join(f.describe() for f in report.findings)


def _tiny_stale_state() -> RunSpec:
    # what the fuzzer shrinks stale_state in eager mode to: one request, one prompt token, one draft step
    return RunSpec(model=model_spec("gpt-oss-mini"), pool=PoolSpec(full_size=4, swa_size=4),
                   timeline=TimelineSpec(requests=(RequestSpec(rid="r0", prompt_len=1, output_len=1),),
                                         draft_steps=1),
                   design="stale_state", mode=Mode.EAGER)


def _finding(spec: RunSpec, target: FuzzTarget) -> Finding:
    verdict = judge_one(spec, Judgement(expected="match", why="")).verdict
    return Finding(target=target, signature=signature(verdict), spec=spec, verdict=verdict, examples=1)


def test_a_finding_is_written_once_per_signature_and_reproduces_when_loaded(tmp_path):
    target = FuzzTarget(design="stale_state", mode=Mode.EAGER)
    finding = _finding(_tiny_stale_state(), target)
    assert finding.signature == "diverge in the swa pool"
    command = target.command(seed=0)
    path = write_regression(finding, folder=tmp_path, command=command)
    assert path is not None and path.parent == tmp_path and path.name.startswith("fuzz_stale_state_eager_")
    text = path.read_text()
    assert 'verdict = "diverge"' in text and command in text and "first divergence: diverge: first at step" in text
    scenario = load_scenario(path)
    assert scenario.designs == ("stale_state",) and scenario.modes == ("eager",)
    assert reproduces(path) == []
    # the same signature from another timeline is the same finding: not written again
    other = dataclasses.replace(finding, spec=dataclasses.replace(
        finding.spec, timeline=dataclasses.replace(finding.spec.timeline, seed=7)))
    assert write_regression(other, folder=tmp_path, command=command) is None
    assert list(tmp_path.iterdir()) == [path]


def test_a_fault_finding_expects_the_clean_twin_too(tmp_path):
    target = FuzzTarget(design="forward_batch", mode=Mode.FULL, faults=frozenset({"pad_slot_minus_one"}))
    # what the fuzzer shrinks it to: one request in the bucket-2 graph, pools of two slots and the dummy, so
    # the padded row's slot -1 is the live token's
    spec = RunSpec(model=model_spec("gpt-oss-mini"), pool=PoolSpec(full_size=3, swa_size=3),
                   timeline=TimelineSpec(requests=(RequestSpec(rid="r0", prompt_len=1, output_len=1),)),
                   design="forward_batch", mode=Mode.FULL, faults=target.faults,
                   graphs=dataclasses.replace(RunSpec.__dataclass_fields__["graphs"].default, decode_buckets=(2,)))
    finding = _finding(spec, target)
    assert finding.signature == "diverge in the swa pool", finding.describe()
    path = write_regression(finding, folder=tmp_path, command=target.command(seed=0))
    scenario = load_scenario(path)
    assert scenario.faults == ("pad_slot_minus_one",)
    assert scenario.expectation("forward_batch").without_faults == "match"
    assert reproduces(path) == []


@pytest.mark.parametrize("argv, error", [
    (["--design", "stale_state", "--mode", "eager", "--fault", "no_zero_swa_pad"],
     "--fault: no_zero_swa_pad acts only in full mode, not eager"),
    (["--design", "forward_batch", "--mode", "full", "--fault", "no_such_fault"], "--fault: unknown fault 'no_such_fault'"),
    (["--design", "forward_batch", "--mode", "full", "--budget", "0"], "--budget: expected seconds"),
    (["--design", "forward_batch", "--mode", "full", "--seed", "-1"], "--seed: expected a non-negative integer"),
])
def test_bad_fuzz_options_are_one_line_errors(argv, error, capsys):
    try:
        rc = main(["fuzz", *argv])
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and error in err, err


def test_the_command_searches_for_its_budget_and_reports_what_it_tried(tmp_path, capsys):
    rc = main(["fuzz", "--design", "metadata", "--mode", "eager", "--budget", "0.5", "--database", str(tmp_path / "db"),
               "--out", str(tmp_path / "out")])
    out = capsys.readouterr()
    assert rc == 0, out
    assert out.out.startswith("fuzz metadata/eager on torch_native: ") and "stopped by the budget; 0 distinct failures" in out.out
    assert "examples tried, 0 distinct failures, 0 shrink steps" in out.err
    assert not (tmp_path / "out").exists()


KNOWN_BAD = [
    FuzzTarget(design="stale_state", mode=Mode.EAGER),
    FuzzTarget(design="forward_batch", mode=Mode.FULL, faults=frozenset({"no_zero_swa_pad"})),
    FuzzTarget(design="forward_batch", mode=Mode.FULL, faults=frozenset({"pad_slot_minus_one"})),
    # issue 30's faults: the strategies must reach the fused FP8 write, the draft graph and the target verify
    FuzzTarget(design="forward_batch", mode=Mode.EAGER, faults=frozenset({"fused_fp8_scale_dropped"})),
    FuzzTarget(design="forward_batch", mode=Mode.FULL, faults=frozenset({"draft_metadata_captured_once"})),
    FuzzTarget(design="forward_batch", mode=Mode.EAGER, faults=frozenset({"skip_free_rejected"})),
    # trees of drafts and draft-extends: the strategies must reach a top-k > 1 verify and a draft-extend forward
    FuzzTarget(design="forward_batch", mode=Mode.EAGER, faults=frozenset({"draft_tree_swa_untranslated"})),
    FuzzTarget(design="forward_batch", mode=Mode.EAGER, faults=frozenset({"draft_extend_without_swa_window"})),
]


@pytest.mark.slow
@pytest.mark.parametrize("target", KNOWN_BAD, ids=[t.label for t in KNOWN_BAD])
def test_a_known_bad_configuration_is_found_shrunk_and_written_as_a_scenario_that_reproduces(target, tmp_path):
    # bounded by counts, not seconds: the same search and the same shrunk case however loaded the machine is
    # (200 shrink examples: with whole drafts replayed by the draft graph, the padded-tail search first meets a
    # draft case that needs about 160 to shrink past to the one-token case)
    report = fuzz(target, budget_s=600, max_examples=25, shrink_s=600, shrink_examples=200, seed=0, database=None,
                  multiple=False)
    assert len(report.findings) == 1, f"{target.label}: {report.tried} examples: " + \
        "\n".join(f.describe() for f in report.findings)
    [finding] = report.findings
    shrunk = finding.spec.timeline
    # shrunk to something a person reads: few requests, short prompts, few steps (about a window of them: a fault
    # that reads one pool at the other's slot ids shows once eviction has made the two pools' ids part, which at
    # the first preset's window of 8 takes 9 tokens)
    assert len(shrunk.requests) <= 3 and all(r.prompt_len <= 16 and r.output_len <= 10 for r in shrunk.requests), \
        finding.describe()
    if target.design == "stale_state":
        assert shrunk.draft_steps >= 1, finding.describe()  # eager stale_state breaks only where drafts drop the SWA locations
    path = write_regression(finding, folder=tmp_path, command=target.command(seed=0))
    assert path is not None
    assert reproduces(path) == []


@pytest.mark.slow
def test_a_failure_found_once_is_replayed_first_from_the_database(tmp_path):
    target = FuzzTarget(design="stale_state", mode=Mode.EAGER)
    first = fuzz(target, budget_s=120, max_examples=40, shrink_s=5, seed=0, database=tmp_path, multiple=False)
    assert first.findings and first.first_failure > 1
    again = fuzz(target, budget_s=120, max_examples=40, shrink_s=1, seed=1, database=tmp_path, multiple=False)
    assert again.first_failure == 1


def test_a_target_is_spelled_design_mode_faults_and_a_stack():
    assert FuzzTarget.parse("forward_batch:full:no_zero_swa_pad") == FuzzTarget(
        design="forward_batch", mode=Mode.FULL, faults=frozenset({"no_zero_swa_pad"}))
    assert FuzzTarget.parse("stale_state:eager") == FuzzTarget(design="stale_state", mode=Mode.EAGER)
    over = FuzzTarget.parse("forward_batch:eager:sglang_skip_evict_mid_prefill@sglang")
    assert over == FuzzTarget(design="forward_batch", mode=Mode.EAGER, serving="sglang",
                              faults=frozenset({"sglang_skip_evict_mid_prefill"}))
    assert over.label == "forward_batch/eager on torch_native over sglang with sglang_skip_evict_mid_prefill"
    assert "--serving sglang" in over.command(seed=0)
    with pytest.raises(ValueError, match="expected design:mode"):
        FuzzTarget.parse("stale_state")
    with pytest.raises(ValueError, match="expected design:mode"):
        FuzzTarget.parse("stale_state:eager@")
    with pytest.raises(ValueError, match="no_zero_swa_pad acts only in full mode"):
        FuzzTarget.parse("stale_state:eager:no_zero_swa_pad")
    # a target's fault patches code the harness's own stack never calls: fuzzing it there could find nothing
    with pytest.raises(ValueError, match=r"patches a target's own code; fuzz it over that target's stack \(--serving sglang\)"):
        FuzzTarget.parse("forward_batch:eager:sglang_skip_evict_mid_prefill")
    with pytest.raises(ValueError, match="no fuzzable serving stack 'vllm'; known: miniature, sglang"):
        FuzzTarget.parse("forward_batch:eager@vllm")


def _drawn(target: FuzzTarget, n: int) -> list[RunSpec]:
    out: list[RunSpec] = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(run_specs(target))
    def collect(spec):
        out.append(spec)

    collect()
    return out


def test_the_strategies_draw_every_axis_of_the_library():
    # shared prefixes, the prefix cache, SGLang's eviction policy and its intervals, target verifies, page sizes:
    # each is drawn somewhere among a few dozen cases (the same ones on any machine)
    specs = _drawn(FuzzTarget(design="forward_batch", mode=Mode.FULL), 60)
    seen = {
        "a shared prefix": any(r.prefix_of for s in specs for r in s.timeline.requests),
        "the prefix cache": any(s.eviction.prefix_cache for s in specs),
        "the sglang policy": any(s.eviction.policy == "sglang" for s in specs),
        "an interval over 1": any(s.eviction.interval > 1 for s in specs if s.eviction.policy == "sglang"),
        "a verify": any(s.timeline.accept_lens for s in specs),
        "a tree of drafts": any(s.timeline.draft_topk > 1 for s in specs),
        "a draft-extend": any(s.timeline.draft_extend for s in specs),
        "a verify graph": any(s.timeline.accept_lens and s.mode == "full" and s.backend == "torch_native"
                              for s in specs),
        "drafts without a verify": any(s.timeline.draft_steps and not s.timeline.accept_lens for s in specs),
        "pages over 1": any(s.pool.page_size > 1 for s in specs),
        "a chunked prefill": any(s.timeline.chunk_size for s in specs),
        "an abort": any(r.abort is not None for s in specs for r in s.timeline.requests),
        "another window": any(s.model.window != model_spec(s.model.name).window for s in specs),
        "per-layer windows": any(s.model.layer_windows for s in specs),
    }
    assert [axis for axis, drawn in seen.items() if not drawn] == []
    assert all(s.serving == "miniature" and problems(s) == [] for s in specs)


def test_a_fault_that_needs_a_verify_gets_one_in_every_case():
    specs = _drawn(FuzzTarget(design="forward_batch", mode=Mode.EAGER, faults=frozenset({"skip_free_rejected"})), 10)
    assert specs and all(s.timeline.accept_lens and s.timeline.draft_steps for s in specs)
    assert all(s.pool.page_size == 1 and not s.eviction.prefix_cache for s in specs)


@pytest.mark.parametrize("fault, drawn", [
    ("draft_tree_swa_untranslated", lambda t: t.draft_topk > 1 and t.accept_lens and not t.draft_extend),
    ("draft_extend_without_swa_window", lambda t: t.draft_extend and t.draft_topk == 1 and t.draft_steps >= 2),
])
def test_a_fault_that_needs_a_tree_or_a_draft_extend_gets_one_in_every_case(fault, drawn):
    specs = _drawn(FuzzTarget(design="forward_batch", mode=Mode.EAGER, faults=frozenset({fault})), 10)
    assert specs and all(drawn(s.timeline) for s in specs), [s.timeline for s in specs]


def test_a_backend_without_tree_metadata_is_never_given_a_tree():
    # torch_gather reads per-branch keys; flashinfer's and trtllm_mha's builders do not (and do not run on a CPU),
    # so a tree is drawn only where the backend declares draft_trees
    specs = _drawn(FuzzTarget(design="forward_batch", mode=Mode.EAGER, backend="torch_gather"), 40)
    assert any(s.timeline.draft_topk > 1 for s in specs)


@pytest.mark.slow
def test_a_campaign_under_pytest_shares_the_database_with_the_search(tmp_path):
    # the campaign module is a plain Hypothesis test (HypoFuzz runs the same); what it finds, the search replays first
    campaign = Path(harness.fuzz.__file__).with_name("campaign.py")
    env = {**os.environ, "HARNESS_FUZZ_TARGET": "stale_state:eager"}
    done = subprocess.run([sys.executable, "-m", "pytest", str(campaign), "-q", "-p", "no:randomly", "-p", "no:cacheprovider"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1 and "PropertyFailed" in done.stdout, done.stdout[-2000:]
    report = fuzz(FuzzTarget(design="stale_state", mode=Mode.EAGER), budget_s=120, max_examples=10, shrink_s=1,
                  seed=3, database=tmp_path / ".cache" / "fuzz", multiple=False)
    assert report.first_failure == 1
