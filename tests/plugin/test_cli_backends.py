"""``python -m harness list`` names every backend with its cells and why this machine skips them, and
``--backend flashinfer`` (a registered GPU backend, by its short name) adds its cells to every scenario."""

from __future__ import annotations

import pytest

from harness.backends import flashinfer as fi_module

from .test_cli import rows, run_cli

NO_GPU = "backend flashinfer needs a CUDA GPU; this machine has none"
FLOAT32 = "backend flashinfer: FlashInfer has no float32 kernels"


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(fi_module.torch.cuda, "is_available", lambda: False)


def _tables(out: str) -> list[list[list[str]]]:
    """Each table of the output as rows of cells split on runs of two spaces or more."""
    return [[[c.strip() for c in line.split("  ") if c.strip()] for line in block.splitlines()]
            for block in out.strip().split("\n\n")]


def test_list_shows_every_backend_and_why_the_cells_a_gpu_backend_adds_are_skipped(cli_dir, capsys, write_scenario,
                                                                                 no_gpu):
    write_scenario(cli_dir, "tiny_match")
    code, out, err = run_cli(capsys, "list", "--backends")
    assert code == 0 and err == ""
    scenarios, backends = _tables(out)  # the sample lists torch_native only: nothing is skipped
    assert backends[0] == ["backend", "runs on", "graphs", "page sizes", "cells", "skipped here"]
    assert {r[0]: r[1:] for r in backends[1:]} == {
        "torch_native": ["cpu,cuda", "UNIFORM_BATCH", "any", "6", "0"],
        "torch_gather": ["cpu,cuda", "UNIFORM_BATCH", "any", "0", "0"],
        "flashinfer": ["cuda", "DECODE_ONLY", "1,4,16,32,64", "0", "0"],
        "trtllm_mha": ["cuda", "DECODE_ONLY", "16,32,64", "0", "0"]}

    code, out, err = run_cli(capsys, "list", "--backend", "flashinfer")
    assert code == 0 and err == ""
    _, backends, skipped = out.strip().split("\n\n")
    assert {r[0]: r[4:] for r in _tables(backends)[0][1:]}["flashinfer"] == ["6", "6"]
    title, row, *why = skipped.splitlines()
    assert title == "skipped here:" and row == "tiny_match on flashinfer: 6 cells (eager,full)"
    why = " ".join(line.strip() for line in why)
    assert FLOAT32 in why and "head_dim 64, 128, 256, not 16" in why and NO_GPU in why
    assert max(map(len, out.splitlines())) <= 100


def test_run_with_the_short_name_flashinfer_adds_its_cells_and_skips_each_saying_why(cli_dir, capsys, write_scenario,
                                                                                    no_gpu):
    write_scenario(cli_dir, "tiny_match")
    code, out, err = run_cli(capsys, "run", "--jobs", "1", "-v", "--backend", "flashinfer")
    assert code == 0, out + err
    table = rows(out)
    assert sorted(table) == sorted(f"tiny_match[{d}-{m}-flashinfer]" for d in ("translate", "stale_state",
                                                                               "forward_batch")
                                   for m in ("eager", "full"))
    assert all(r[2] == "skipped" for r in table.values())
    assert "6 runs: 0 as expected, 0 unexpected, 6 skipped" in out


def test_a_cpu_backend_named_on_the_command_line_runs_only_where_a_scenario_lists_it(cli_dir, capsys,
                                                                                   write_scenario):
    write_scenario(cli_dir, "tiny_match")  # lists torch_native only
    code, _, err = run_cli(capsys, "run", "--jobs", "1", "--backend", "torch_gather")
    assert code == 2 and "no runs selected" in err
