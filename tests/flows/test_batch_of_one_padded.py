"""A batch of one token, replayed in a padded bucket, equals its eager run bit for bit on every CPU backend.

One request decoding alone is the case a padded graph meets most and a library scenario rarely pins: its eager
forward has one token, so every [tokens, ...] operand has a leading dim of 1, which ``reshape`` merges with any
stride and hands back as a strided view where two tokens would get a copy. A kernel that relies on reshape for
contiguity then sends the eager product down another GEMM path than the bucket's, and the two differ in the last
bits (about 1e-7) at key widths of 16 and more: a false alarm on every design."""

import dataclasses

import pytest

from harness.runspec import GraphSpec
from harness.serving.timeline import RequestSpec, TimelineSpec

from ._flows import graph_equals_eager_bitwise, replace, spec_for


def _alone(window: int) -> TimelineSpec:
    # a prompt of one token: the next steps decode one token each, in bucket 2 (no bucket of 1)
    return TimelineSpec(requests=(RequestSpec(rid="a", prompt_len=1, output_len=2 * window + 3),), seed=5)


@pytest.mark.parametrize("backend", ["torch_native", "torch_gather"])
@pytest.mark.parametrize("drafts", [0, 2])
def test_one_request_in_a_padded_bucket_replays_equal_to_eager(backend, drafts):
    spec = spec_for("gpt-oss-mini", _alone, "full", backend=backend)
    if drafts:
        spec = replace(spec, timeline=dataclasses.replace(spec.timeline, draft_steps=drafts, accept_lens=(1,)))
    graph_equals_eager_bitwise(replace(spec, graphs=GraphSpec(decode_buckets=(2, 4))))
