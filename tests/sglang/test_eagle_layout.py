"""The draft's slot layout against SGLang's own EAGLE code: ``per_step_draft_out_cache_loc`` (0.5.23's
``eagle_utils``, the one place its worker and backends read a draft step's slots from) run on the harness's
draft allocation gives the rows the harness's draft steps write, in eager drafts and inside the draft graph."""

import dataclasses

import pytest
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


# ---- SGLang's own draft-location kernels, in Triton's interpreter -----------------------------------------

def _drafts(timeline: TimelineSpec, *, window: int | None = None):
    """Every draft batch of ``timeline`` (eager, torch_native), with the session as it stood when the batch was
    built: the draft's slots are in ``req_to_token``, nothing of the draft has run yet."""
    model = model_spec("gpt-oss-mini")
    if window is not None:
        model = dataclasses.replace(model, window=window)
    session = assemble(RunSpec(model=model, pool=PoolSpec(full_size=160, swa_size=96), timeline=timeline,
                               mode="eager"))
    while (step := session.scheduler.next_step()) is not None:
        if step.batch.forward_mode is ForwardMode.DRAFT:
            yield session, step.batch
        session.run_batch(step.batch)
        session.scheduler.finish_step()


def _requests(batch):
    """The draft's requests (one row of ``req_to_token`` each) and their committed lengths, SGLang's ``bs``
    view of a batch whose rows are ``bs * topk``."""
    topk = batch.draft_topk
    # contiguous: a kernel reads a tensor from its data pointer, as a device kernel does
    return batch.req_pool_indices[::topk].contiguous(), batch.positions[::topk].to(torch.int64).contiguous()


_TREE = TimelineSpec(requests=(RequestSpec(rid="a", prompt_len=5, output_len=12),
                               RequestSpec(rid="b", prompt_len=9, output_len=12),
                               RequestSpec(rid="c", prompt_len=3, output_len=12)),
                     seed=5, draft_steps=3, draft_topk=2, accept_lens=(0, 2, 3, 1))
_CHAIN = dataclasses.replace(_TREE, draft_topk=1)


@pytest.mark.parametrize("timeline", [_CHAIN, _TREE], ids=["topk1", "topk2"])
def test_sglangs_assign_draft_cache_locs_reads_the_harness_draft_allocation_out_of_req_to_token(timeline):
    """SGLang's worker copies each request's ``topk * steps`` draft slots out of ``req_to_token`` from its
    ``seq_lens`` on: run on the harness's ``req_to_token`` it gives the draft the harness allocated, request-major
    (every draft of a timeline that crosses the window edge, drafts with and without accepted tokens before)."""
    from harness.serving.draft_tree import request_order
    from harness.sglang.eagle_kernels import assign_draft_cache_locs

    seen = 0
    for session, batch in _drafts(timeline, window=8):
        rows, seq_lens = _requests(batch)
        sglang = assign_draft_cache_locs(rows, session.req_to_token_pool.req_to_token, seq_lens,
                                         topk=batch.draft_topk, steps=batch.draft_steps)
        assert torch.equal(sglang, request_order(batch.draft_out_cache_loc, topk=batch.draft_topk).long())
        seen += 1
    assert seen >= 3


def _harness_keys(session, batch, step: int, *, untranslated: bool = False):
    """[rows, width] full-pool and SWA slots the harness's backends read at draft ``step`` of a tree draft
    (``tree_slot_table``, ``tree_swa_slot_table``), and each row's key count."""
    from harness.backends.page_table import tree_slot_table, tree_swa_slot_table

    req_to_token = session.req_to_token_pool.req_to_token
    kv_lens = batch.positions.to(torch.int64) + step + 1
    full = tree_slot_table(req_to_token, batch.req_pool_indices, batch.draft_tree, kv_lens, req_to_token.shape[1])
    swa = session.pool.full_to_swa_index_mapping[full]
    return full, tree_swa_slot_table(full, swa, batch.draft_tree, untranslated=untranslated), kv_lens


def test_sglangs_draft_decode_kv_indices_are_the_keys_the_harness_tree_drafts_read():
    """SGLang's ``generate_draft_decode_kv_indices`` (the multi-step draft's key lists of its FlashInfer and
    Triton backends) against the harness's tree-draft tables, every step of every draft, every branch: the
    full-pool keys as they are, and the SWA layers' keys translated through the pool's full-to-SWA map (the
    kernel's ``TRANSLATE`` path, SGLang PR 24617's fix: the branch's own run translated too)."""
    from harness.sglang.eagle_kernels import draft_decode_kv_indices

    checked = 0
    for session, batch in _drafts(_TREE, window=8):
        rows, seq_lens = _requests(batch)
        req_to_token = session.req_to_token_pool.req_to_token
        mapping = session.pool.full_to_swa_index_mapping
        plain = draft_decode_kv_indices(rows, req_to_token, seq_lens, topk=2, steps=batch.draft_steps)
        translated = draft_decode_kv_indices(rows, req_to_token, seq_lens, topk=2, steps=batch.draft_steps,
                                             v2p=mapping)
        for step in range(batch.draft_steps):
            full, swa, kv_lens = _harness_keys(session, batch, step)
            for row in range(batch.batch_size):
                n = int(kv_lens[row])
                assert torch.equal(plain.keys(step, row), full[row, :n]), (step, row)
                assert torch.equal(translated.keys(step, row), swa[row, :n]), (step, row)
                checked += 1
    assert checked >= 3 * 3 * 6


def test_the_untranslated_tree_fault_reads_other_keys_than_sglangs_translated_kernel():
    """The harness's ``draft_tree_swa_untranslated`` (the branch's run left at full-pool ids in the SWA layers'
    table) is what SGLang's kernel gives without ``TRANSLATE`` there, and not what it gives with it: the fault
    re-creates the pre-fix read, and this check would catch a harness table that drifted from SGLang's."""
    from harness.sglang.eagle_kernels import draft_decode_kv_indices

    session, batch = next(_drafts(_TREE, window=8))
    rows, seq_lens = _requests(batch)
    mapping = session.pool.full_to_swa_index_mapping
    translated = draft_decode_kv_indices(rows, session.req_to_token_pool.req_to_token, seq_lens, topk=2,
                                         steps=batch.draft_steps, v2p=mapping)
    _, faulty, kv_lens = _harness_keys(session, batch, batch.draft_steps - 1, untranslated=True)
    differs = [row for row in range(batch.batch_size)
               if not torch.equal(translated.keys(batch.draft_steps - 1, row), faulty[row, : int(kv_lens[row])])]
    assert differs == list(range(batch.batch_size))  # every row reads its branch's run


def test_a_strided_view_is_refused_by_name_not_read_as_its_storages_first_rows():
    from harness.sglang.eagle_kernels import assign_draft_cache_locs

    req_to_token = torch.arange(64, dtype=torch.int32).view(4, 16)
    with pytest.raises(ValueError, match="req_pool_indices is a strided view"):
        assign_draft_cache_locs(torch.tensor([0, 0, 2, 2])[::2], req_to_token, torch.tensor([3, 4]), topk=1, steps=2)
