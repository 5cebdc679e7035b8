"""The benchmark machinery: rows come out with real timings and the markdown section is rewritten in place.

Nothing here asserts on speed: performance is measured by ``make bench``, never by the test suite.
"""

import gc
import weakref
from pathlib import Path

import pytest
import torch

from harness import bench
from harness.bench import measure
from harness.bench_rows import BenchRow
from harness.report.bench import BEGIN, END, render_markdown, write_section


def test_measure_produces_timed_rows_for_decode_padded_and_prefill():
    rows = measure(presets=["all-swa"], decode_buckets=(2,), prefill_buckets=(16,), repeats=1, warmup=1,
                   targets=[("tape", "cpu")])
    assert [(r.kind, r.bucket, r.real) for r in rows] == [("decode", 2, 2), ("decode", 2, 1), ("prefill", 16, 16)]
    for row in rows:
        assert row.preset == "all-swa" and row.engine == "tape" and row.device == "cpu"
        assert row.eager_ms > 0 and row.replay_ms > 0 and row.capture_ms > 0
        assert row.ratio_p10 <= row.ratio <= row.ratio_p90


def test_a_timed_call_runs_as_a_worker_child_runs_a_task_without_the_cyclic_collector():
    """What a run pays: a collection set off mid-capture by the pins it allocates is no library run's cost."""
    assert gc.isenabled()
    seen = []
    ms = bench._timed(lambda: seen.append(gc.isenabled()), lambda: None)  # noqa: SLF001
    assert seen == [False] and ms >= 0
    assert gc.isenabled()


def test_a_timed_capture_starts_with_no_graph_of_its_bucket_and_leaves_a_replayable_one():
    """At start-up a runner has no graph of the bucket: freeing the last capture's tape is no capture's cost."""
    runner, eager, batch = bench._decode_case("all-swa", 2, 2, "tape", "cpu")  # noqa: SLF001
    first = weakref.ref(runner.graphs[2])
    freed_before = []
    capture = runner._capture  # noqa: SLF001

    def watched(bucket: int) -> None:
        freed_before.append(first() is None and bucket not in runner.graphs)
        capture(bucket)

    runner._capture = watched  # noqa: SLF001
    assert bench._capture_ms(runner, 2, repeats=2, device="cpu") > 0  # noqa: SLF001
    assert freed_before == [True, True]
    assert torch.equal(runner.forward(batch), eager.forward(batch))


def _row(ratio: float) -> BenchRow:
    return BenchRow(preset="p", kind="decode", bucket=1, real=1, engine="tape", device="cpu", eager_ms=1.0,
                    replay_ms=ratio, ratio=ratio, ratio_p10=ratio, ratio_p90=ratio, capture_ms=3.0)


def test_section_is_created_then_replaced_idempotently(tmp_path: Path):
    out = tmp_path / "BENCHMARKS.md"
    info = {"device": "cpu"}
    write_section(out, render_markdown([_row(0.5)], info))
    first = out.read_text()
    assert first.startswith("# Benchmarks") and first.count(BEGIN) == 1 and first.count(END) == 1
    assert "| yes |" in first

    write_section(out, render_markdown([_row(0.5)], info))
    assert out.read_text() == first

    write_section(out, render_markdown([_row(2.0)], info))
    second = out.read_text()
    assert second.count(BEGIN) == 1 and second.count(END) == 1
    assert "| no |" in second and "| yes |" not in second
    assert not list(tmp_path.glob(".*.tmp"))  # the temporary file was renamed into place


def test_text_outside_the_markers_is_kept(tmp_path: Path):
    out = tmp_path / "B.md"
    out.write_text(f"intro\n\n{BEGIN}\nold\n{END}\n\nafterword\n")
    write_section(out, "new")
    assert out.read_text() == f"intro\n\n{BEGIN}\nnew\n{END}\n\nafterword\n"
    out.write_text("no markers yet\n")
    write_section(out, "new")
    assert out.read_text() == f"no markers yet\n\n{BEGIN}\nnew\n{END}\n"


def test_the_gpu_table_marks_the_replay_goal_per_bucket_and_compares_flashinfer_with_torch_native():
    from harness.bench import render_gpu_markdown
    from harness.bench_rows import GpuBenchRow

    rows = [GpuBenchRow(backend="torch_native", dtype="bfloat16", bucket=4, eager_ms=2.0, replay_ms=0.5),
            GpuBenchRow(backend="torch_native", dtype="bfloat16", bucket=16, eager_ms=2.0, replay_ms=1.5),
            GpuBenchRow(backend="flashinfer", dtype="bfloat16", bucket=4, eager_ms=3.0, replay_ms=0.8),
            GpuBenchRow(backend="flashinfer", dtype="bfloat16", bucket=8, eager_ms=3.0, replay_ms=2.0)]
    lines = render_gpu_markdown(rows, "H200").splitlines()
    assert "| torch_native | bfloat16 | 4 | 2.000 | 0.500 | 4.00x | met |" in lines
    assert "| torch_native | bfloat16 | 16 | 2.000 | 1.500 | 1.33x | n/a |" in lines  # past batch size 8: no goal
    assert "| flashinfer | bfloat16 | 8 | 3.000 | 2.000 | 1.50x | missed |" in lines
    assert "| 4 | 1.50 | 1.60 |" in lines  # FlashInfer over torch-native, only where both ran the bucket


def test_the_gpu_benchmark_without_a_gpu_says_so_and_exits_2(capsys, tmp_path):
    from harness.bench import main

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["--gpu", "--out", str(tmp_path / "B.md")]) == 2
    assert "the GPU benchmark needs CUDA: no GPU on this machine" in capsys.readouterr().err


def test_the_gpu_benchmark_runs_flashinfer_on_a_bfloat16_head_dim_64_copy_of_the_preset():
    from harness.bench import _spec
    from harness.runspec import GraphSpec
    from harness.serving.timeline import TimelineSpec

    spec = _spec("gpt-oss-mini", TimelineSpec(requests=()), mode="full", graphs=GraphSpec(decode_buckets=(1,)),
                 engine="cuda", device="cuda", backend="flashinfer", dtype="bfloat16")
    assert (spec.backend, spec.model.dtype, spec.model.head_dim, spec.pool.kv_dtype) == (
        "flashinfer", "bfloat16", 64, "bfloat16")
    assert spec.model.window == 8 and spec.model.layer_pattern == ("swa", "full", "swa", "full")  # else the preset's


def test_each_graph_kind_is_held_to_its_own_replay_goal_and_every_capture_to_the_capture_goal():
    import dataclasses

    decode, prefill = _row(0.7), dataclasses.replace(_row(0.7), kind="prefill", capture_ms=20.0)
    assert not decode.ok and prefill.ok  # decode: at most 0.6x; prefill (attention an eager island): 0.8x
    assert decode.capture_ok and not prefill.capture_ok
    text = render_markdown([decode, prefill], {"device": "cpu"})
    assert "2 rows, 1 above their replay goal (decode <= 0.6x eager, prefill <= 0.8x eager), 1 with a capture above 15 ms" in text
