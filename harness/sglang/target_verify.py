"""SGLang's EAGLE target-verify forward (top-k 1 chains) driven through the installed TRT-LLM MHA backend, eagerly
and in SGLang's decode graph runner captured for ``TARGET_VERIFY``.

What is SGLang's (0.5.23), run unchanged:

* the verify input: ``EagleVerifyInput`` built from SGLang's own chain-tree kernel (``sglang.kernels.ops.
  speculative.eagle.build_chain_tree``, the ``topk == 1`` branch of ``eagle_worker_common``'s verify preparation,
  a Triton kernel run by Triton's interpreter as ``trtllm_cpu`` runs the metadata kernels): the verify's tokens
  (the bonus token, then the draft), positions ``seq_lens + arange(1 + steps)``, the ``retrieve_*`` chain
  links, the ``QLEN_ONLY`` causal-within-draft mask, and the verify's ``out_cache_loc`` read back from
  ``req_to_token`` (checked against the harness's allocation: ``VerifyMismatch``);
* the ``ForwardBatch`` with ``ForwardMode.TARGET_VERIFY``, ``seq_lens`` the committed lengths (the backend adds
  the draft tokens), ``spec_info`` that input, ``spec_algorithm`` EAGLE;
* the backend's target-verify metadata: eagerly ``init_forward_metadata``'s target-verify branch (cache_seqlens
  = seq_lens + tokens per request, the page tables and SWA page table from SGLang's page-table kernel, the SWA
  write ids from the iteration's plan); in a graph ``init_cuda_graph_state``'s ``target_verify_metadata``,
  ``_build_cuda_graph_metadata`` at capture and ``_apply_cuda_graph_metadata`` at every replay (the fused
  metadata kernel with ``seqlen_offset = 1 + steps``, rebuilding cache_seqlens, the page table, the SWA page
  table and the SWA write ids inside the graph);
* ``forward_extend``'s verify path: the KV writes (``SWAKVPool.set_kv_buffer`` at ``out_cache_loc`` and the
  metadata's ``swa_out_cache_loc``) and ``_run_fixed_q_len_decode`` with ``q_len_per_req = 1 + steps``;
* with ``timeline.draft_extend = "v2"``, the draft-extend after each verify as 0.5.23's worker builds it
  (``eagle_worker_common.prepare_for_draft_extend``): its lengths and positions from SGLang's
  ``prepare_draft_extend_layout`` kernel (interpreted; checked against the harness's batch: ``DraftExtendMismatch``),
  a ``ForwardBatch`` of ``ForwardMode.DRAFT_EXTEND_V2`` with an ``EagleDraftExtendInput``, the verify's plan bound
  to it, and the backend's eager ``init_forward_metadata`` and ``forward_extend`` decode-kernel path over the
  window, run before the verify's rejected slots are freed (the miniature's draft model is the target: the target
  model runner's backend runs it, eagerly; ``EAGLEDraftExtendCudaGraphRunner`` needs a draft model runner);
* the graph runner: the installed ``DecodeCudaGraphRunner`` over a model runner whose ``spec_algorithm`` is
  EAGLE (SGLang's target model runner), so it captures ``TARGET_VERIFY`` with ``captured_req_width = 1 + steps``
  (``decode_num_tokens_per_req``), builds its capture ``EagleVerifyInput`` itself (``get_spec_info``), and its
  ``can_run_graph`` refuses a verify of another width (a request's last, shorter draft), which runs eagerly.

What is the harness's: the draft (the harness scheduler's draft steps, each run as a plain SGLang decode forward
of the target: SGLang's draft worker, its multi-step draft backend and ``EAGLEDraftCudaGraphRunner`` need a
draft model runner the CPU adapter does not build), the acceptance (the timeline's ``accept_lens``, applied by the
harness's ``VerifyPlan``: SGLang's ``EagleVerifyInput.verify`` samples from logits), and FlashInfer's decode
kernel (``trtllm_cpu.trtllm_batch_decode_with_kv_cache``: causal within each request's ``q_len_per_req`` rows).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from ..serving.model import ModelSpec
from .installed import load
from .model_runner import publish_cpu_server_args
from .triton_interpreter import interpreted


class VerifyMismatch(AssertionError):
    """SGLang's chain-tree kernel and the harness's verify plan disagree on a verify's tokens, positions or slots."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyReplay:
    """What one target-verify forward ran on."""

    step: int
    raw_bs: int
    tokens_per_req: int
    bucket: int | None
    """the captured batch size it replayed (None: eager, ``can_run_graph`` said no or no runner)"""
    seq_lens: tuple[int, ...] = ()
    """the backend's ``cache_seqlens`` after the forward: committed length plus the verify's tokens"""
    swa_out_cache_loc: tuple[int, ...] = ()
    """where the forward wrote its SWA layers (the metadata's ``swa_out_cache_loc``, the batch's rows)"""
    planned_swa_out_cache_loc: tuple[int, ...] = ()
    """the translation of the verify's ``out_cache_loc`` when its batch was built"""


@contextmanager
def eagle_chain(model: ModelSpec, steps: int) -> Iterator[None]:
    """SGLang's speculative configuration for EAGLE top-k 1 chains of ``steps`` drafts (``--speculative-*``), as the
    backend and the graph runner read it (``get_spec()``) while the block runs, over the CPU server args of
    ``model`` (published first)."""
    publish_cpu_server_args(model)
    from sglang.srt.runtime_context import get_spec

    with get_spec().override(speculative_algorithm="EAGLE", speculative_num_steps=steps,
                             speculative_eagle_topk=1, speculative_num_draft_tokens=1 + steps):
        yield


def make_target_model_runner(model_runner: Any) -> None:
    """The stand-in model runner as SGLang's EAGLE target runner: its graph runner captures ``TARGET_VERIFY``."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    model_runner.spec_algorithm = SpeculativeAlgorithm.EAGLE
    model_runner.is_draft_worker = False


def chain_tree(bonus_tokens: torch.Tensor, draft_tokens: torch.Tensor, seq_lens: torch.Tensor,
               req_pool_indices: torch.Tensor, req_to_token: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """SGLang's ``build_chain_tree`` (its Triton kernel in Triton's interpreter): ``(mask, positions,
    retrieve_index, retrieve_next_token, retrieve_next_sibling, tokens, out_cache_loc, mrope)``."""
    load()
    from sglang.kernels.ops.speculative import eagle as module

    with interpreted(module, "_build_chain_tree_kernel"):
        return module.build_chain_tree(bonus_tokens, draft_tokens, seq_lens, req_pool_indices=req_pool_indices,
                                       req_to_token=req_to_token)


def verify_forward_batch(api: Any, batch: Any, *, steps: int) -> Any:
    """The installed ``ForwardBatch`` of a harness ``TARGET_VERIFY`` batch (a chain's: ``1 + steps`` tokens per
    request), its ``EagleVerifyInput`` from SGLang's chain-tree kernel."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.eagle_info import EagleVerifyInput
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    if batch.draft_tree is not None:
        raise ValueError("target verify on SGLang's backend: top-k 1 chains only (a tree's verify needs its "
                         "custom mask, which the TRT-LLM-GEN decode kernel stand-in does not read)")
    bs, width = batch.batch_size, 1 + steps
    committed = batch.extend_prefix_lens.to(torch.int64)  # SGLang's verify seq_lens: before the draft tokens
    ids = batch.input_ids.to(torch.int64).view(bs, width)
    req_pool_indices = batch.req_pool_indices.to(torch.int64)
    mask, positions, retrieve_index, next_token, next_sibling, tokens, out_cache_loc, _ = chain_tree(
        ids[:, 0].contiguous(), ids[:, 1:].contiguous(), committed, req_pool_indices,
        batch.req_to_token_pool.req_to_token)
    for name, theirs, ours in (("tokens", tokens, batch.input_ids), ("positions", positions, batch.positions),
                               ("out_cache_loc", out_cache_loc, batch.out_cache_loc)):
        if not torch.equal(theirs.to(torch.int64), ours.to(torch.int64)):
            raise VerifyMismatch(f"verify {name}: SGLang's chain tree {theirs.tolist()}, the harness's plan "
                                 f"{ours.tolist()}")
    seq_lens_cpu = committed.cpu()
    spec_info = EagleVerifyInput(
        draft_token=tokens, custom_mask=mask, positions=positions, retrieve_index=retrieve_index,
        retrieve_next_token=next_token, retrieve_next_sibling=next_sibling, retrieve_cum_len=None, spec_steps=steps,
        topk=1, draft_token_num=width, capture_hidden_mode=CaptureHiddenMode.FULL,
        seq_lens_sum=int(seq_lens_cpu.sum()), seq_lens_cpu=seq_lens_cpu)
    return api.ForwardBatch(
        forward_mode=api.ForwardMode.TARGET_VERIFY, batch_size=bs, input_ids=tokens,
        req_pool_indices=req_pool_indices, seq_lens=committed, out_cache_loc=out_cache_loc,
        seq_lens_sum=int(seq_lens_cpu.sum()), positions=positions, seq_lens_cpu=seq_lens_cpu,
        spec_algorithm=SpeculativeAlgorithm.EAGLE, spec_info=spec_info, capture_hidden_mode=CaptureHiddenMode.FULL,
    )


class DraftExtendMismatch(AssertionError):
    """SGLang's draft-extend layout kernel and the harness's V2 draft-extend disagree on its lengths or positions."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DraftExtendReplay:
    """What one ``DRAFT_EXTEND_V2`` forward (the draft-extend over a verify's window) ran on."""

    step: int
    raw_bs: int
    tokens_per_req: int
    accepted: int
    """draft tokens the verify before it accepted (each request's ``num_correct_drafts``)"""
    seq_lens: tuple[int, ...] = ()
    """the backend's ``cache_seqlens`` after the forward: committed length plus the whole window"""
    swa_out_cache_loc: tuple[int, ...] = ()
    """where the forward wrote its SWA layers (the metadata's ``swa_out_cache_loc``)"""
    planned_swa_out_cache_loc: tuple[int, ...] = ()
    """the translation of the verify's ``out_cache_loc`` when the draft-extend's batch was built (before the frees)"""
    rejected_held: bool = False
    """none of the verify's slots (the rejected drafts' included) was free in either pool when it ran"""


def draft_extend_layout(seq_lens: torch.Tensor, num_draft_tokens: int) -> tuple[torch.Tensor, ...]:
    """SGLang's ``prepare_draft_extend_layout`` (its Triton kernel in Triton's interpreter) over the committed
    ``seq_lens``: ``(prefix_lens, extend_lens, post_seq_lens, positions, start_locs)`` of a ``DRAFT_EXTEND_V2``
    over ``num_draft_tokens`` tokens per request."""
    load()
    from sglang.kernels.ops.speculative import eagle as module

    with interpreted(module, "_prepare_draft_extend_lengths_kernel"):
        prefix, extend, post, (positions, starts, _) = module.prepare_draft_extend_layout(
            seq_lens, num_draft_tokens, False)
    return prefix, extend, post, positions, starts


def draft_extend_v2_forward_batch(api: Any, batch: Any, verify_fb: Any, *, steps: int, accepted: int,
                                  translator: Any) -> Any:
    """The installed ``ForwardBatch`` of a harness V2 draft-extend (``batch``: ``1 + steps`` tokens per request at
    the verify's slots), as ``eagle_worker_common.prepare_for_draft_extend`` builds it: ``ForwardMode.
    DRAFT_EXTEND_V2``, the committed lengths as prefixes and the window as the extend (SGLang's layout kernel),
    ``seq_lens`` the post-write lengths, an ``EagleDraftExtendInput`` as ``spec_info``, and the verify's
    ``kv_loc_plan`` bound to it (the window it writes again)."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.eagle_info import EagleDraftExtendInput
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    bs, width = batch.batch_size, 1 + steps
    committed = batch.extend_prefix_lens.to(torch.int64)
    prefix, extend, post, positions, starts = draft_extend_layout(committed, width)
    for name, theirs, ours in (("prefix_lens", prefix, batch.extend_prefix_lens),
                               ("extend_lens", extend, batch.extend_seq_lens), ("seq_lens", post, batch.seq_lens),
                               ("positions", positions, batch.positions),
                               ("out_cache_loc", verify_fb.out_cache_loc, batch.out_cache_loc)):
        if not torch.equal(theirs.to(torch.int64), ours.to(torch.int64)):
            raise DraftExtendMismatch(f"draft-extend {name}: SGLang's {theirs.tolist()}, the harness's "
                                      f"{ours.tolist()}")
    post_cpu = post.cpu()
    req_pool_indices = batch.req_pool_indices.to(torch.int64)
    correct = torch.full((bs,), accepted, dtype=torch.int32)
    spec_info = EagleDraftExtendInput(
        hidden_states=None, num_correct_drafts=correct, num_accept_tokens=correct + 1,
        num_accept_tokens_cpu=[accepted + 1] * bs, input_ids=batch.input_ids.to(torch.int64), seq_lens=post,
        seq_lens_cpu=post_cpu, req_pool_indices=req_pool_indices, positions=positions,
        capture_hidden_mode=CaptureHiddenMode.FULL, num_tokens_per_req=width,
        select_index=torch.arange(bs, dtype=torch.int64) * width + accepted)
    fb = api.ForwardBatch(
        forward_mode=api.ForwardMode.DRAFT_EXTEND_V2, batch_size=bs, input_ids=batch.input_ids.to(torch.int64),
        req_pool_indices=req_pool_indices, seq_lens=post, out_cache_loc=verify_fb.out_cache_loc,
        seq_lens_sum=int(post_cpu.sum()), positions=positions, seq_lens_cpu=post_cpu,
        spec_algorithm=SpeculativeAlgorithm.EAGLE, spec_info=spec_info, capture_hidden_mode=CaptureHiddenMode.FULL,
    )
    fb.extend_seq_lens = extend
    fb.extend_prefix_lens = prefix
    fb.extend_seq_lens_cpu = [width] * bs
    fb.extend_prefix_lens_cpu = committed.tolist()
    fb.extend_num_tokens = bs * width
    fb.extend_start_loc = starts
    # prepare_for_draft_extend hands init_new the iteration's plan: the draft-extend writes the verify's window
    verify_fb.kv_loc_plan.bind(fb, translator)
    return fb


def enter_draft_step(batch: Any, step: int) -> None:
    """Point a harness DRAFT batch at draft step ``step``, as the harness's speculative worker does
    (``ForwardBatch.enter_draft_step``)."""
    batch.enter_draft_step(step)


__all__ = ["DraftExtendMismatch", "DraftExtendReplay", "VerifyMismatch", "VerifyReplay", "chain_tree",
           "draft_extend_layout", "draft_extend_v2_forward_batch", "eagle_chain", "enter_draft_step",
           "make_target_model_runner", "verify_forward_batch"]
