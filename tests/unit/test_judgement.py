"""One spec, one expectation, no matrix: ``judge_one`` runs the spec and its reference and says whether the
expectation held; ``declared_judgement`` is what a design's declaration expects of a clean run."""

from harness.check.expect import NO_EXPECTATION
from harness.check.judgement import Judgement, declared_judgement, judge_one
from harness.check.drive import execute
from harness.runspec import Outcome, RunSpec
from harness.serving.model import model_spec
from harness.serving.pool import PoolSpec
from harness.serving.timeline import RequestSpec, TimelineSpec

SPEC = RunSpec(model=model_spec("gpt-oss-mini"), pool=PoolSpec(full_size=64, swa_size=32),
               timeline=TimelineSpec(requests=(RequestSpec(rid="a", prompt_len=9, output_len=4),), seed=2),
               design="translate")


def test_a_sound_design_holds_its_declared_judgement_and_fails_a_wrong_one():
    judged = judge_one(SPEC, declared_judgement("translate"))
    assert judged.held and judged.verdict.outcome == Outcome.MATCH
    assert judged.summary() == "translate/eager on torch_native: as expected: expected match, got match"
    wrong = judge_one(SPEC, Judgement(expected=Outcome.DIVERGE, why="a wrong guess"),
                      reference=execute(SPEC.reference()))
    assert not wrong.held and "unexpected: expected diverge, got match" in wrong.summary()


def test_nothing_expected_never_holds_and_the_reference_run_is_its_own_subject():
    reference = execute(SPEC.reference())
    judged = judge_one(SPEC.reference(), Judgement(expected=NO_EXPECTATION, why="added"), reference=reference)
    assert judged.verdict.outcome == Outcome.MATCH and not judged.held
