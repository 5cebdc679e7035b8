"""What a scenario file can make the harness do is bounded before it does it: a file that is not a regular
file or is huge is never read, what a run would allocate is estimated at load time, and names that look
the same are the same name."""

from __future__ import annotations

import os
import threading
import time
import unicodedata
from pathlib import Path

import pytest

from harness.cli import main
from harness.runspec import RUN_MEMORY_LIMIT, GraphSpec
from harness.scenario import ScenarioError, load_all, load_scenario
from harness.scenario.memory import attention_bytes_per_column, graph_memory_problems, timeline_memory_problems
from harness.scenario.schema import FILE_LIMIT
from harness.serving.model import model_spec
from harness.serving.pool import PoolSpec

GOOD = (Path(__file__).resolve().parents[1] / "plugin" / "samples" / "tiny_match.toml").read_text()


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line]


def test_a_fifo_named_on_the_command_line_is_refused_without_blocking(tmp_path, capsys):
    fifo = tmp_path / "s.toml"
    os.mkfifo(fifo)
    # in a thread of this process: opening a FIFO for reading blocks until a writer comes, so a blocked
    # thread is the failure, and opening the writing end below is what unblocks it
    done: list[int] = []
    thread = threading.Thread(target=lambda: done.append(main(["list", str(fifo)])), daemon=True)
    thread.start()
    thread.join(30)
    blocked = thread.is_alive()
    if blocked:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(30)
    assert not blocked, "listing a FIFO blocked"
    assert done == [1]
    assert _lines(capsys.readouterr().err) == [f"{fifo}: not a regular file (a scenario is a .toml file)"]


def test_a_huge_file_is_refused_before_it_is_read(tmp_path, capsys):
    huge = tmp_path / "huge.toml"
    with huge.open("wb") as f:
        f.write(GOOD.encode())
        f.truncate(4 << 30)  # 4 GiB, sparse: costs no disk, and reading it would cost 4 GiB of memory
    start = time.monotonic()
    assert main(["list", str(huge)]) == 1
    assert _lines(capsys.readouterr().err) == [f"{huge}: {4 << 30} bytes, more than the {FILE_LIMIT >> 10} KiB a "
                                               "scenario file may hold"]
    assert time.monotonic() - start < 5


def test_a_folder_of_scenarios_skips_what_is_not_a_file(tmp_path):
    (tmp_path / "tiny_match.toml").write_text(GOOD)
    os.mkfifo(tmp_path / "pipe.toml")
    specs, errors = load_all([tmp_path])
    assert [s.name for s in specs] == ["tiny_match"] and errors == []


@pytest.mark.parametrize("form", ["NFC", "NFD"])
def test_names_that_differ_only_by_normalization_are_one_name(tmp_path, capsys, form):
    first, second = unicodedata.normalize("NFC", "swa_café"), unicodedata.normalize("NFD", "swa_café")
    assert first != second
    (tmp_path / f"{first}.toml").write_text(GOOD)
    (tmp_path / f"{second}.toml").write_text(GOOD)
    specs, errors = load_all([tmp_path])
    assert [s.name for s in specs] == [first]  # NFC, whichever form the file name has
    assert len(errors) == 1 and errors[0].problems[0].endswith(
        "name: duplicate scenario name 'swa_café' (the file names differ only in Unicode normalization); already "
        f"loaded from {specs[0].path}")
    assert unicodedata.normalize("NFC", load_scenario(tmp_path / f"{unicodedata.normalize(form, 'swa_café')}.toml")
                                 .name) == first


@pytest.mark.parametrize(("impostor", "note"), [
    ("swa_decode_pad_tail_n\u043et_zeroed", "its character 22 is U+043E CYRILLIC SMALL LETTER O ('о') where the "
                                            "other has U+006F LATIN SMALL LETTER O ('o')"),
    ("swa_decode_p\u0430d_tail_not_zeroed", "U+0430 CYRILLIC SMALL LETTER A"),
    ("swa_decode_pad_tail_not_zer\u03bfed", "U+03BF GREEK SMALL LETTER OMICRON"),
    ("\uff53wa_decode_pad_tail_not_zeroed", "U+FF53 FULLWIDTH LATIN SMALL LETTER S"),
], ids=["cyrillic-o", "cyrillic-a", "greek-omicron", "fullwidth-s"])  # not the names: -k swa_decode selects scenarios
def test_a_name_that_looks_like_a_loaded_one_is_refused(tmp_path, capsys, impostor, note):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "swa_decode_pad_tail_not_zeroed.toml").write_text(GOOD)
    (tmp_path / "b" / f"{impostor}.toml").write_text(GOOD)
    assert main(["list", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert impostor not in out and "swa_decode_pad_tail_not_zeroed" in out
    [line] = _lines(err)
    assert line.startswith(f"{tmp_path / 'b' / impostor}.toml: name: scenario name '{impostor}' looks like "
                           "'swa_decode_pad_tail_not_zeroed', already loaded from ") and note in line, line


def test_names_that_only_share_letters_of_other_scripts_both_load(tmp_path):
    for name in ("swa_кот", "swa_код", "swa_decode"):  # Cyrillic words, not look-alikes of each other
        (tmp_path / f"{name}.toml").write_text(GOOD)
    specs, errors = load_all([tmp_path])
    assert sorted(s.name for s in specs) == ["swa_decode", "swa_код", "swa_кот"] and errors == []


# ---- memory: bounded where it is spent --------------------------------------------------------------------

def _with(path: Path, pool: str = "", graphs: str = "") -> Path:
    text = GOOD.replace("full_size = 32\nswa_size = 16\n", f"full_size = 32\nswa_size = 16\n{pool}")
    path.write_text(text.replace("decode_buckets = [1, 2]\n", graphs or "decode_buckets = [1, 2]\n"))
    return path


def _problems(path: Path) -> tuple[str, ...]:
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    return err.value.problems


def test_decode_page_tables_past_the_bound_are_refused_at_load(tmp_path):
    # the example: 2^20 rows x 4096 columns of page tables is 64 GiB, in every full-mode run
    (line,) = _problems(_with(tmp_path / "s.toml", pool="max_context_len = 4096\n",
                              graphs="decode_buckets = [1, 1048576]\n"))
    assert ": graphs.decode_buckets: the decode graphs need " in line
    assert "(page tables of 1048576 rows x 4096 columns, 65536 MiB," in line and "shrink the buckets" in line


def test_decode_graphs_count_only_when_the_scenario_runs_full_mode(tmp_path):
    path = _with(tmp_path / "s.toml", pool="max_context_len = 4096\n", graphs="decode_buckets = [1048576]\n")
    path.write_text(path.read_text().replace('modes = ["eager", "full"]', 'modes = ["eager"]'))
    assert load_scenario(path).graphs.decode_buckets == (1048576,)


def test_the_estimate_follows_what_a_captured_bucket_keeps():
    # measured: one bucket of 256 rows over 4096 columns keeps 2357 MiB in gpt-oss-mini (4 layers)
    model, pool = model_spec("gpt-oss-mini"), PoolSpec(full_size=64, swa_size=64, max_context_len=4096)
    assert attention_bytes_per_column(model, pool) * 256 * 4096 * 4 >> 20 == 2340
    fits = GraphSpec(decode_buckets=(1, 2, 4, 8, 16, 32))
    assert graph_memory_problems(model, pool, fits, ["full"]) == []
    assert graph_memory_problems(model, pool, GraphSpec(decode_buckets=(256,)), ["full"])
    assert graph_memory_problems(model, pool, GraphSpec(decode_buckets=(256,)), ["eager", "piecewise"]) == []


def test_pools_the_diff_cannot_rebuild_within_the_bound_are_refused_at_load(tmp_path):
    # pools of 2^19 slots pass the KV bound, but the diff keeps three working copies of them
    (line,) = _problems(_pools(tmp_path, 1 << 19))
    assert (": pool: the diff rebuilds each step's pools 3 times (the subject's at the step and the step before, "
            "the reference's), 3 x 390 MiB, and keeps both runs' snapshots of what their 41 steps change, ") in line
    assert f"more than the {RUN_MEMORY_LIMIT >> 20} MiB a run may use" in line


def test_pools_snapshotted_only_where_a_step_changes_them_load_where_whole_copies_did_not(tmp_path):
    # 41 steps of pools of 2^18 slots: 7.7 GiB copied whole at every step, a few MiB of what each step changed
    assert load_scenario(_pools(tmp_path, 1 << 18)).pool.full_size == 1 << 18


def test_snapshots_of_a_long_timeline_past_the_bound_are_refused_naming_the_timeline():
    model, pool = model_spec("gpt-oss-mini"), PoolSpec(full_size=4096, swa_size=4096)
    (problem,) = timeline_memory_problems(model, pool, step_tokens=[4096] * 2000, largest_forward=(1, 0))
    assert problem.key == "timeline" and "keeps both runs' snapshots of what their 2000 steps change" in problem.message


def _pools(tmp_path: Path, slots: int, output_len: int = 40) -> Path:
    path = tmp_path / "big.toml"
    path.write_text(GOOD.replace("full_size = 32\nswa_size = 16\n", f"full_size = {slots}\nswa_size = {slots}\n")
                    .replace("output_len = 3", f"output_len = {output_len}"))
    return path


def test_fewer_steps_or_smaller_pools_load(tmp_path):
    assert load_scenario(_pools(tmp_path, 1 << 18, output_len=3)).pool.full_size == 1 << 18
    assert load_scenario(_pools(tmp_path, 1 << 14)).timeline.requests[0].output_len == 40


def test_the_largest_forward_past_the_bound_is_refused_and_chunking_fixes_it(tmp_path):
    path = tmp_path / "s.toml"
    text = GOOD.replace("full_size = 32\nswa_size = 16\n", "full_size = 8192\nswa_size = 8192\nmax_context_len = 4096\n")
    text = text.replace("prompt_len = 5", "prompt_len = 4000")
    path.write_text(text)
    (line,) = _problems(path)
    assert ": timeline: the forward of 4000 tokens at step 0 attends over 4096 page-table columns: " in line
    path.write_text(text.replace("seed = 3", "seed = 3\nchunk_size = 256"))
    assert load_scenario(path).timeline.chunk_size == 256
