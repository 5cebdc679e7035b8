"""The draft's slot layout against SGLang's own EAGLE code: ``per_step_draft_out_cache_loc`` (0.5.23's
``eagle_utils``, the one place its worker and backends read a draft step's slots from) run on the harness's
draft allocation gives the rows the harness's draft steps write, in eager drafts and inside the draft graph."""

import torch

from harness.check.run.assemble import assemble
from harness.runners.draft_graph import DraftGraphRunner
from harness.runspec import GraphSpec, RunSpec
from harness.serving.batch import ForwardMode
from harness.serving.model_spec import model_spec
from harness.serving.pool import PoolSpec
from harness.serving.timeline import RequestSpec, TimelineSpec
from harness.sglang import installed

_TIMELINE = TimelineSpec(requests=(RequestSpec(rid="a", prompt_len=5, output_len=10),
                                   RequestSpec(rid="b", prompt_len=3, output_len=10),
                                   RequestSpec(rid="c", prompt_len=4, output_len=10)),
                         seed=3, draft_steps=3, accept_lens=(1,), draft_extend=True)


def _per_step():
    installed.load()  # the torchvision stand-in the import chain needs
    from sglang.srt.speculative.eagle_utils import per_step_draft_out_cache_loc

    return per_step_draft_out_cache_loc


def _first_draft(mode: str):
    spec = RunSpec(model=model_spec("gpt-oss-mini"), pool=PoolSpec(full_size=96, swa_size=64), timeline=_TIMELINE,
                   mode=mode, graphs=GraphSpec(decode_buckets=(4,)))
    session = assemble(spec)
    while (step := session.scheduler.next_step()).batch.forward_mode is not ForwardMode.DRAFT:
        session.run_batch(step.batch)
        session.scheduler.finish_step()
    return session, step.batch


def test_the_draft_steps_rows_are_sglangs_per_step_slices_of_the_allocation():
    per_step = _per_step()
    _, batch = _first_draft("eager")
    flat = batch.draft_out_cache_loc.t().reshape(-1)  # request-major, as the builder allocated it
    assert batch.draft_topk == 1  # a chain: SGLang's layout at top-k 1
    assert torch.equal(per_step(flat, batch.batch_size, batch.draft_topk, batch.draft_steps), batch.draft_out_cache_loc)


def test_the_draft_graph_reads_sglangs_per_step_slices_of_its_static_allocation():
    per_step = _per_step()
    session, batch = _first_draft("full")
    (runner,) = [r for r in session.runner.runners if isinstance(r, DraftGraphRunner)]
    session.run_batch(batch)  # fills the static buffers, padding row included, and replays
    bucket, steps = 4, runner.steps
    static = runner.out_cache_loc[: bucket * runner.topk * steps]
    rows = per_step(static, bucket, runner.topk, steps)
    assert torch.equal(rows[:, : batch.batch_size], batch.draft_out_cache_loc)
    assert torch.equal(rows[:, batch.batch_size :], torch.zeros_like(rows[:, batch.batch_size :]))  # the dummy slot
