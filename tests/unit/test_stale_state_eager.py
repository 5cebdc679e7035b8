"""stale_state diverges in an eager flow through the mechanism itself: the draft batch carries no
out_cache_loc_swa, the eager step therefore leaves pool.swa_loc as the previous batch set it."""


from harness.check.drive import execute
from harness.check.verdict import judge
from harness.runspec import RunSpec
from harness.serving.model import model_spec
from harness.serving.pool import PoolSpec
from harness.serving.timeline import RequestSpec, TimelineSpec
from workloads import draft_after_prefill


def _judge(timeline, design):
    ms = model_spec("gpt-oss-mini")
    spec = RunSpec(model=ms, pool=PoolSpec(full_size=64, swa_size=32), timeline=timeline, design=design)
    return judge(execute(spec), execute(spec.reference()))


def test_stale_state_writes_drafts_over_the_prefill_slot():
    timeline = draft_after_prefill(model_spec("gpt-oss-mini").window)
    verdict = _judge(timeline, "stale_state")
    assert verdict.outcome == "diverge"
    first = verdict.first
    assert first.pool == "swa" and first.classification in ("overwritten", "unwritten")
    assert _judge(timeline, "forward_batch").outcome == "match"
    assert _judge(timeline, "translate").outcome == "match"


def test_stale_state_length_mismatch_is_an_error_verdict_not_a_crash():
    timeline = TimelineSpec(
        requests=(RequestSpec(rid="a", prompt_len=9, output_len=6), RequestSpec(rid="b", prompt_len=4, output_len=6)),
        draft_steps=3,
    )
    verdict = _judge(timeline, "stale_state")
    assert verdict.outcome == "error"
    assert verdict.error.type == "RuntimeError" and "shape" in verdict.error.message
    assert verdict.error.step is not None
    assert _judge(timeline, "forward_batch").outcome == "match"
