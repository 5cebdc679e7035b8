"""Named workloads reused across eager, graph and emulated runs in the tests (vLLM's BATCH_SPECS idea): test
data, so it lives here; `pythonpath = ["tests"]` (pyproject.toml) makes it `import workloads` from any test."""

from __future__ import annotations

from harness.serving.timeline import RequestSpec, TimelineSpec


def prefill_lengths(window: int) -> TimelineSpec:
    """One request per edge case of the window: W-1, W, W+1 and 2W+1 prompt tokens, then a few decodes."""
    lengths = (window - 1, window, window + 1, 2 * window + 1)
    return TimelineSpec(
        requests=tuple(RequestSpec(rid=f"p{n}", prompt_len=n, output_len=3) for n in lengths), seed=11
    )


def chunked_decode(window: int) -> TimelineSpec:
    """Chunked prefill crossing the window, then decode well past it: SWA slots are evicted and reused."""
    return TimelineSpec(
        requests=(
            RequestSpec(rid="long", prompt_len=2 * window + 3, output_len=2 * window),
            RequestSpec(rid="late", arrive=2, prompt_len=window + 1, output_len=window + 2),
        ),
        chunk_size=window,
        seed=12,
    )


def continuous_batching(window: int) -> TimelineSpec:
    """Arrivals while others decode, a finish and an abort: heterogeneous batches of 1 to 4 requests."""
    return TimelineSpec(
        requests=(
            RequestSpec(rid="a", prompt_len=window + 2, output_len=10),
            RequestSpec(rid="b", arrive=1, prompt_len=3, output_len=12),
            RequestSpec(rid="c", arrive=3, prompt_len=window - 1, output_len=4),
            RequestSpec(rid="d", arrive=4, prompt_len=2 * window, output_len=9, abort=10),
        ),
        chunk_size=2 * window,
        seed=13,
    )


def draft_after_prefill(window: int, draft_steps: int = 3) -> TimelineSpec:
    """A prefill whose last chunk is one token, then speculative drafts of one request.

    The last extend batch leaves ``pool.swa_loc`` one token long, the draft batch size, so a design that
    reads that state writes the drafts' SWA K/V into the prefill token's slot instead of failing.
    """
    chunk = window
    return TimelineSpec(
        requests=(RequestSpec(rid="s", prompt_len=2 * chunk + 1, output_len=2 * draft_steps),),
        chunk_size=chunk,
        draft_steps=draft_steps,
        seed=14,
    )


def heterogeneous_decode(window: int) -> TimelineSpec:
    """Decode batches of 4, 3, 2 and 1 requests of different lengths: padded buckets, at least 3 replays."""
    return TimelineSpec(
        requests=(
            RequestSpec(rid="a", prompt_len=window + 3, output_len=12),
            RequestSpec(rid="b", prompt_len=2, output_len=3),
            RequestSpec(rid="c", prompt_len=window - 1, output_len=6),
            RequestSpec(rid="d", prompt_len=2 * window + 1, output_len=9),
            RequestSpec(rid="e", arrive=8, prompt_len=3, output_len=4),
        ),
        seed=21,
    )


def heterogeneous_prefill(window: int) -> TimelineSpec:
    """Several extend batches of different token counts and request mixes, chunked across the window."""
    return TimelineSpec(
        requests=(
            RequestSpec(rid="a", prompt_len=2 * window + 5, output_len=2),
            RequestSpec(rid="b", arrive=1, prompt_len=window - 1, output_len=2),
            RequestSpec(rid="c", arrive=1, prompt_len=3, output_len=1),
            RequestSpec(rid="d", arrive=4, prompt_len=window + 1, output_len=2),
        ),
        chunk_size=window + 2,
        seed=22,
    )


def heterogeneous_drafts(window: int, draft_steps: int = 2) -> TimelineSpec:
    """Speculative drafts of three requests that finish at different steps: draft batches of 3, 2 and 1 (padded
    buckets), one request drafting past the window, and a last draft shorter than the others (a request one
    token from its end drafts one step)."""
    return TimelineSpec(
        requests=(
            RequestSpec(rid="a", prompt_len=window + 3, output_len=4 * draft_steps + 1),
            RequestSpec(rid="b", prompt_len=2, output_len=2 * draft_steps),
            RequestSpec(rid="c", prompt_len=window - 1, output_len=3 * draft_steps),
        ),
        draft_steps=draft_steps,
        seed=23,
    )
