import pytest
import torch

from harness.backends.registry import backend_class
from harness.serving.allocator import SWATokenToKVPoolAllocator
from harness.serving.batch import ForwardMode, make_forward_batch
from harness.serving.designs import DESIGNS, DesignImportError, resolve_design
from harness.serving.miniature import MiniatureStack
from harness.serving.model import model_spec
from harness.serving.pool import HybridSWAKVPool, PoolSpec, ReqToTokenPool


@pytest.fixture
def setup():
    spec = model_spec("gpt-oss-mini")
    pool = HybridSWAKVPool(spec=PoolSpec(full_size=32, swa_size=16), layer_is_swa=spec.layer_is_swa,
                           num_kv_heads=2, head_dim=16)
    r2t = ReqToTokenPool(max_running_requests=2, max_context_len=16)
    alloc = SWATokenToKVPoolAllocator(pool)
    locs = alloc.alloc(3)
    row = r2t.alloc()
    r2t.write(row, 0, locs)
    batch = make_forward_batch(
        forward_mode=ForwardMode.EXTEND, input_ids=torch.zeros(3, dtype=torch.int64), positions=torch.arange(3),
        req_pool_indices=torch.tensor([row]), prefix_lens=[0], extend_lens=[3], out_cache_loc=locs,
        req_to_token_pool=r2t, pool=pool, translate=pool.translate_loc_from_full_to_swa,
    )
    return spec, pool, r2t, alloc, batch


class _Md:
    out_cache_loc_swa = None


def test_forward_batch_returns_precomputed_locations_even_when_translation_changed(setup):
    _, pool, _, alloc, batch = setup
    precomputed = batch.out_cache_loc_swa
    alloc.free_swa(batch.out_cache_loc)  # a fresh translation would now give zeros
    assert DESIGNS["forward_batch"](batch, pool, _Md(), 0) is precomputed
    assert DESIGNS["translate"](batch, pool, _Md(), 0).tolist() == [0, 0, 0]


def test_forward_batch_translates_without_precomputed_locations(setup):
    _, pool, _, _, batch = setup
    expected = pool.translate_loc_from_full_to_swa(batch.out_cache_loc)
    batch.reassign_out_cache_loc(batch.out_cache_loc)
    assert batch.out_cache_loc_swa is None
    assert torch.equal(DESIGNS["forward_batch"](batch, pool, _Md(), 0), expected)


@pytest.mark.parametrize("design", ["translate", "forward_batch"])
def test_garbage_swa_loc_never_influences(design, setup):
    _, pool, _, _, batch = setup
    expected = DESIGNS[design](batch, pool, _Md(), 0).clone()
    pool.set_swa_loc(torch.tensor([9, 9, 9, 9, 9], dtype=torch.int32))
    assert torch.equal(DESIGNS[design](batch, pool, _Md(), 0), expected)


def test_stale_state_reads_whatever_swa_loc_holds(setup):
    _, pool, _, _, batch = setup
    garbage = torch.tensor([9, 9], dtype=torch.int32)
    pool.set_swa_loc(garbage)
    assert DESIGNS["stale_state"](batch, pool, _Md(), 0) is garbage


@pytest.mark.parametrize("design", list(DESIGNS))
def test_full_layers_write_at_out_cache_loc_untouched(design, setup):
    spec, pool, r2t, _, batch = setup
    backend = backend_class("torch_native")(model_spec=spec, stack=MiniatureStack.over(pool, r2t),
                                            design=DESIGNS[design])
    backend.init_forward_metadata(batch)
    pool.set_swa_loc(batch.out_cache_loc_swa)
    full_layer = spec.layer_is_swa.index(False)
    assert backend.impl._get_layer_cache_loc(full_layer, batch, backend.forward_metadata) is batch.out_cache_loc


def test_metadata_design_reads_backend_copy(setup):
    spec, pool, r2t, _, batch = setup
    backend = backend_class("torch_native")(model_spec=spec, stack=MiniatureStack.over(pool, r2t),
                                            design=DESIGNS["metadata"])
    backend.init_forward_metadata(batch)
    got = backend.impl._get_layer_cache_loc(0, batch, backend.forward_metadata)
    assert got is backend.forward_metadata.out_cache_loc_swa
    assert torch.equal(got, batch.out_cache_loc_swa)


def test_untranslated_writes_at_the_full_slots_and_asserts_past_the_swa_pool(setup):
    spec, pool, r2t, alloc, batch = setup
    alloc.free_swa(batch.out_cache_loc)  # the SWA slots are freed, the full ones kept: the id spaces part
    later = alloc.alloc(3)
    assert not torch.equal(pool.translate_loc_from_full_to_swa(later).long(), later)
    assert DESIGNS["untranslated"](batch, pool, _Md(), 0) is batch.out_cache_loc  # the full ids, as they are
    past = make_forward_batch(
        forward_mode=ForwardMode.DECODE, input_ids=torch.zeros(1, dtype=torch.int64), positions=torch.tensor([3]),
        req_pool_indices=batch.req_pool_indices, prefix_lens=[3], extend_lens=[1],
        out_cache_loc=torch.tensor([pool.swa_size]), req_to_token_pool=r2t, pool=pool,
        translate=pool.translate_loc_from_full_to_swa)
    with pytest.raises(RuntimeError, match=r"device-side assert: out-of-bounds index into the SWA pool \(16 slots\)"):
        DESIGNS["untranslated"](past, pool, _Md(), 0)


def test_third_party_design_by_import_path():
    assert resolve_design("harness.serving.designs:translate") is DESIGNS["translate"]
    with pytest.raises(KeyError, match="unknown design"):
        resolve_design("nope")
    with pytest.raises(DesignImportError, match="cannot be imported"):
        resolve_design("no.such.module:fn")


def test_the_design_table_in_docs_is_the_declarations():
    from pathlib import Path

    from harness.serving.designs import DESIGN_RECORDS

    readme = (Path(__file__).resolve().parents[2] / "docs/scenarios.md").read_text()
    table = readme[readme.index("| design | declared | rule | stands for |"):].split("\n\n", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    assert [r[0].strip("`") for r in rows] == [d.name for d in DESIGN_RECORDS], "docs/scenarios.md's design table and DESIGN_RECORDS disagree"
    for row, d in zip(rows, DESIGN_RECORDS):
        kind = row[1].split("; ")
        assert kind[0] == ("sound" if d.sound else "known-wrong"), d.name
        assert ("needs a plan" in row[1]) is d.needs_plan and ("opt-in" in row[1]) is d.opt_in, d.name
        assert row[2] == d.rule and row[3] == d.reference, d.name


def test_defaults_leave_out_the_opt_in_designs_and_a_declared_import_path_keeps_its_record():
    from harness.serving.designs import DEFAULT_DESIGNS, DESIGN_RECORDS, declare, declared

    assert DEFAULT_DESIGNS == tuple(d.name for d in DESIGN_RECORDS if not d.opt_in)
    assert declared("translate").sound and declared("harness.serving.designs:translate") is None

    @declare(sound=False, rule="r", reference="ref")
    def mine(forward_batch, pool, metadata, layer_id):
        return forward_batch.out_cache_loc

    assert mine.design.name.endswith(":mine") and mine.design.fn is mine and not mine.design.sound
