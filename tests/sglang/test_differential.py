"""The miniature against the installed SGLang, step by step, on every library timeline SGLang can express."""

import dataclasses
from pathlib import Path

import pytest

from harness.scenario.loader import load_scenario
from harness.serving.eviction import EvictionPolicy, EvictionSpec, RequestWindow
from harness.serving.registry import eviction_policy
from harness.sglang import differential
from harness.sglang.eviction import InstalledSGLangEviction

LIBRARY = sorted((Path(__file__).resolve().parents[2] / "scenarios").glob("**/*.toml"))


def _run_spec(path: Path):
    scenario = load_scenario(path)
    return scenario.run_spec(design=scenario.designs[0], mode=scenario.modes[0], backend=scenario.backends[0],
                             with_faults=False)


# SGLang's SWA_EVICTION_INTERVAL default (128) and the interval that frees every token; no pages, pages of 4 and of 16
CONFIGS = [(page, interval) for interval in (1, 128) for page in (1, 4, 16)]


# the name with hyphens: `pytest -k swa_prefill` selects the scenario family's items, not this test too
@pytest.mark.parametrize("page_size, interval", CONFIGS, ids=lambda v: str(v))
@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: p.stem.replace("_", "-"))
def test_the_miniatures_schedule_slots_mapping_and_frees_are_sglangs_step_by_step(path, page_size, interval):
    spec = _run_spec(path)
    knobs = {"page_size": page_size, "interval": interval}
    reason = differential.not_expressible(spec, **knobs)
    if reason is not None:
        pytest.skip(f"not expressible against SGLang 0.5.23: {reason}")
    miniature, sglang = differential.trace(spec, installed=False, **knobs), differential.trace(spec, installed=True, **knobs)
    # a pool too small at this page size runs out at once: then both sides must run out alike
    assert miniature.steps or miniature.exhausted, "nothing ran"
    found = differential.first_difference(miniature, sglang)
    named = differential.named_difference(path.stem, **knobs)
    if named is None:
        assert found is None
    else:  # SGLang's radix tree acts otherwise here, by name: the traces agree up to where it shows
        name, at = named
        assert found is not None and found.startswith(at + " differs"), \
            f"PREFIX_CACHE_DIFFERENCES[{name!r}] says {at}; the first difference is {found}"


def test_every_named_radix_tree_difference_names_a_prefix_cache_scenario_of_the_library():
    stems = {p.stem for p in LIBRARY if load_scenario(p).eviction.prefix_cache}
    for name, difference in differential.PREFIX_CACHE_DIFFERENCES.items():
        assert difference.reason and difference.shows, name
        for stem, page_size, interval in difference.shows:
            assert stem in stems and (page_size, interval) in CONFIGS, (name, stem, page_size, interval)


def test_a_request_that_sits_out_an_extend_batch_keeps_its_slots_in_sglang_and_the_miniature():
    """The issue's minimal timeline: a (prompt 8, 6 outputs) decodes; b (prompt 4, 2 outputs) arrives at step
    3 and prefills alone; window 4. SGLang frees nothing of a while building b's batch."""
    import dataclasses as dc

    from harness.serving.timeline import RequestSpec, TimelineSpec

    base = _run_spec(next(p for p in LIBRARY if p.stem == "swa_evict_sglang_policy_fifo_reuse"))
    spec = dc.replace(base, timeline=TimelineSpec(requests=(
        RequestSpec(rid="a", prompt_len=8, output_len=6), RequestSpec(rid="b", arrive=3, prompt_len=4, output_len=2))),
        model=dc.replace(base.model, window=4))
    sglang = differential.trace(spec, installed=True, page_size=1, interval=1)
    by_index = {s.index: s for s in sglang.steps}
    assert by_index[3].kind == "extend" and by_index[3].evicted == ()
    assert [pos for rid, pos in by_index[4].evicted if rid == "a"] == [6]
    assert differential.first_difference(differential.trace(spec, installed=False, page_size=1, interval=1),
                                         sglang) is None


def test_the_comparison_sees_the_miniatures_own_free_order():
    spec = _run_spec(next(p for p in LIBRARY if p.stem == "swa_evict_sglang_policy_fifo_reuse"))
    sglang = differential.trace(spec, installed=True)
    lowest_first = dataclasses.replace(spec, pool=dataclasses.replace(spec.pool, free_order="lowest"))
    original = differential.comparable_spec
    try:
        differential.comparable_spec = lambda s, **kw: dataclasses.replace(original(s, **kw), pool=lowest_first.pool)
        miniature = differential.trace(spec, installed=False)
    finally:
        differential.comparable_spec = original
    assert "differs" in (differential.first_difference(miniature, sglang) or "")


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("interval", [1, 4])
def test_the_miniatures_sglang_policy_puts_the_frontier_where_the_installed_function_does(page_size, interval):
    spec = EvictionSpec(policy="sglang", interval=interval)
    mine: EvictionPolicy = eviction_policy(spec, window=5, page_size=page_size)
    theirs = InstalledSGLangEviction(spec, window=5, page_size=page_size)
    for seq_len in range(1, 30):
        for evicted in range(0, seq_len, page_size):
            for decoded in (0, 1, 3):
                req = RequestWindow(seq_len=seq_len, swa_evicted=evicted, prefilling=False, decoded=decoded)
                assert mine.frontier(req) == theirs.frontier(req), req
            req = RequestWindow(seq_len=seq_len, swa_evicted=evicted, prefilling=True, decoded=0)
            assert mine.frontier(req) == theirs.frontier(req), req


def test_in_chunked_prefill_both_free_at_an_interval_of_one():
    spec = EvictionSpec(policy="sglang", interval=4)
    req = RequestWindow(seq_len=10, swa_evicted=4, prefilling=True, decoded=0)
    assert InstalledSGLangEviction(spec, window=5).frontier(req) == 6
    assert eviction_policy(spec, window=5).frontier(req) == 6
