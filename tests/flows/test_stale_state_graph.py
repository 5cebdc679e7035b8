"""stale_state under decode graphs: without the capture-time preset (before SGLang PR 23552) the graph
bakes in whichever tensor pool.swa_loc held when it was captured, and the input audit names it."""

from harness.check.run.drive import execute
from harness.check.matrix.verdict import judge
from harness.runspec import GraphSpec, RunSpec
from harness.serving.model import model_spec
from harness.serving.pool import PoolSpec
from harness.serving.timeline import RequestSpec, TimelineSpec

# Two one-token prompts leave pool.swa_loc two long, the size of the only bucket, so the graph captured on
# demand for the first decode batch binds the prefill's SWA slots. A third request makes a batch of 3
# that no bucket fits: it runs eagerly and rebinds the attribute, which the next replays report as stale.
TIMELINE = TimelineSpec(
    requests=(
        RequestSpec(rid="a", prompt_len=1, output_len=10),
        RequestSpec(rid="b", prompt_len=1, output_len=10),
        RequestSpec(rid="c", arrive=3, prompt_len=2, output_len=2),
    ),
    seed=4,
)


def _spec(design, faults=()):
    return RunSpec(
        model=model_spec("gpt-oss-mini"), pool=PoolSpec(full_size=64, swa_size=32), timeline=TIMELINE,
        design=design, mode="full", faults=frozenset(faults),
        graphs=GraphSpec(decode_buckets=(2,), capture="on_demand"),
    )


def test_stale_state_diverges_when_capture_does_not_preset_swa_loc():
    spec = _spec("stale_state", ["no_preset_swa_loc"])
    reference = execute(spec.reference())
    verdict = judge(execute(spec), reference)
    assert verdict.outcome == "diverge", verdict
    assert verdict.first.pool == "swa"
    findings = {(f.kind, f.path) for f in verdict.observations.findings}
    assert ("unregistered", "pool.swa_loc") in findings
    assert ("stale", "pool.swa_loc") in findings


def test_same_flow_matches_with_the_preset_and_for_forward_batch():
    reference = execute(_spec("forward_batch").reference())
    assert judge(execute(_spec("stale_state")), reference).outcome == "match"
    faulted = judge(execute(_spec("forward_batch", ["no_preset_swa_loc"])), reference)
    assert faulted.outcome == "match"
    assert ("stale", "pool.swa_loc") not in {(f.kind, f.path) for f in faulted.observations.findings}
