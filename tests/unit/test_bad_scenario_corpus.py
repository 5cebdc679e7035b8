"""The corpus of bad scenario files: each gives one clean line naming the file, the key and what was
expected; none raises; none stops the others from loading. The files live in ``tests/corpus/bad/`` (made
by ``tests/corpus/generate.py``), each opening with ``# expect: <fragment of its one problem line>``."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.scenario import ScenarioError, load_all, load_scenario

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "bad"
FILES = sorted(CORPUS.glob("*.toml"))


def expected_fragment(path: Path) -> str:
    first = path.read_bytes().decode("utf-8", "replace").lstrip("\ufeff").splitlines()[0]
    assert first.startswith("# expect: "), path
    return first.removeprefix("# expect: ")


def test_the_corpus_holds_at_least_forty_files():
    assert len(FILES) >= 40


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_a_bad_file_gives_one_line_naming_file_key_and_expectation(path: Path):
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    problems = err.value.problems
    assert len(problems) == 1, problems
    line = problems[0]
    assert line.startswith(f"{path}: ") and "\n" not in line, line
    assert expected_fragment(path) in line, line
    assert line.isprintable(), line


def test_no_bad_file_stops_the_others_from_loading(tmp_path: Path):
    good = Path(__file__).resolve().parents[2] / "scenarios" / "swa_prefill_window_edge.toml"
    specs, errors = load_all([CORPUS, good])
    assert [s.name for s in specs] == ["swa_prefill_window_edge"]
    assert len(errors) == len(FILES)


def test_an_unexpected_exception_while_loading_is_one_line_for_that_file(monkeypatch, tmp_path: Path):
    import harness.scenario.loader as loader

    def broken(spec, **_):
        raise IndexError("a bug")

    monkeypatch.setattr(loader, "check_scenario", broken)
    good = Path(__file__).resolve().parents[2] / "scenarios" / "swa_prefill_window_edge.toml"
    specs, errors = load_all([good])
    assert specs == [] and [e.problems for e in errors] == [
        (f"{good}: cannot be loaded (a harness bug, please report it): IndexError: a bug",)]
