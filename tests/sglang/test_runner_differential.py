"""The harness's own DecodeGraphRunner against SGLang's DecodeCudaGraphRunner on the same timeline: the bucket
each decode batch replays, the static buffers after each fill, the padded rows. Every difference is named in
``DIFFERENCES`` with its reason; everything else must be equal."""

import dataclasses
from pathlib import Path

import pytest

from harness.check.run.drive import execute
from harness.runners.decode_graph import DecodeGraphRunner
from harness.scenario.loader import load_scenario
from harness.serving.miniature import MiniatureStack
from harness.sglang import differential

ROOT = Path(__file__).resolve().parents[2]

DIFFERENCES = {
    "request rows": "the runners' req_pool_indices hold each side's own request rows, which differ by design "
                    "(differential.DIFFERENCES['request rows']); compared on the padded rows only (row 0 on both)",
    "swa id dtype": "the harness's static out_cache_loc_swa is int32, SGLang's TRT-LLM cuda_graph_swa_out_cache_loc "
                    "int64; compared as values",
}


@dataclasses.dataclass(frozen=True)
class Fill:
    raw_bs: int
    bucket: int | None
    out_cache_loc: tuple[int, ...] = ()
    seq_lens: tuple[int, ...] = ()
    padded_req_pool_indices: tuple[int, ...] = ()
    swa_out_cache_loc: tuple[int, ...] = ()


def _harness_fills(spec, monkeypatch) -> list[Fill]:
    fills: list[Fill] = []
    original_fill, original_eager = DecodeGraphRunner._fill, DecodeGraphRunner._run_eagerly

    def fill(self, batch, bucket):
        original_fill(self, batch, bucket)
        n = batch.batch_size
        fills.append(Fill(raw_bs=n, bucket=bucket, out_cache_loc=tuple(self.out_cache_loc[:bucket].tolist()),
                          seq_lens=tuple(self.seq_lens[:bucket].tolist()),
                          padded_req_pool_indices=tuple(self.req_pool_indices[n:bucket].tolist()),
                          swa_out_cache_loc=tuple(self.out_cache_loc_swa[:bucket].tolist())))

    def eager(self, batch, num_tokens, *, fallback):
        if fallback:
            fills.append(Fill(raw_bs=batch.batch_size, bucket=None))
        return original_eager(self, batch, num_tokens, fallback=fallback)

    monkeypatch.setattr(DecodeGraphRunner, "_fill", fill)
    monkeypatch.setattr(DecodeGraphRunner, "_run_eagerly", eager)
    result = execute(spec)
    assert result.error is None, result.error
    return fills


def _sglang_fills(run) -> list[Fill]:
    return [Fill(raw_bs=d.raw_bs, bucket=d.bucket, out_cache_loc=d.padded_out_cache_loc, seq_lens=d.padded_seq_lens,
                 padded_req_pool_indices=d.padded_req_pool_indices[d.raw_bs:],
                 swa_out_cache_loc=d.padded_swa_out_cache_loc) if d.bucket is not None
            else Fill(raw_bs=d.raw_bs, bucket=None) for d in run.decodes]


def _harness_spec(name: str, faults=()):
    scenario = load_scenario(ROOT / "scenarios" / f"{name}.toml")
    mode = next(m for m in scenario.modes if m != "eager")
    spec = differential.comparable_spec(scenario.run_spec(
        design=scenario.designs[0], mode=mode, backend=scenario.backends[0], with_faults=False))
    return dataclasses.replace(spec, faults=frozenset(faults))


def _both(name, monkeypatch, trtllm_runs, faults=()):
    """The harness runner's fills (its own stack, backend and runner, in graph mode) and SGLang's (the TRT-LLM
    backend under DecodeCudaGraphRunner; run_timeline makes the spec comparable itself)."""
    harness = _harness_fills(_harness_spec(name, faults), monkeypatch)
    return harness, _sglang_fills(trtllm_runs(ROOT / "scenarios" / f"{name}.toml")[2])


def test_the_comparison_sees_a_stale_padded_swa_id_in_the_harness_runner(monkeypatch, trtllm_runs):
    """The harness runner with PR 24743's fault (no_zero_swa_pad) against SGLang's: the padded rows differ."""
    harness, sglang = _both("swa_decode_padded_buckets", monkeypatch, trtllm_runs, faults=("no_zero_swa_pad",))
    differing = [(mine, theirs) for mine, theirs in zip(harness, sglang) if mine != theirs]
    assert differing
    for mine, theirs in differing:
        n = mine.raw_bs
        assert mine.swa_out_cache_loc[:n] == theirs.swa_out_cache_loc[:n]
        assert mine.swa_out_cache_loc[n:] != theirs.swa_out_cache_loc[n:] == (0,) * (mine.bucket - n)


@pytest.mark.parametrize("name", ["swa_decode_padded_buckets", "swa_paged_decode_pages_of_4"],
                         ids=lambda n: n.replace("_", "-"))  # hyphens: -k <family> keeps to scenario items
def test_the_harness_runner_fills_its_static_buffers_as_sglangs_does(name, monkeypatch, trtllm_runs):
    harness, sglang = _both(name, monkeypatch, trtllm_runs)
    assert harness and len(harness) == len(sglang)
    for step, (mine, theirs) in enumerate(zip(harness, sglang)):
        assert mine == theirs, f"decode batch {step}: harness {mine} != SGLang {theirs}"
