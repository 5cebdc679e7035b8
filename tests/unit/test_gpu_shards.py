"""The split of the GPU suite across a CI matrix (pytest-split over tests/gpu_durations.json, the algorithm
``harness.gpuci.plan`` names): every item in exactly one shard, the same shards on every machine, and a
test added without a recorded duration moving only the tests at the shards' edges. pytest-split is the
optional extra ci (``make test-gpu`` installs it); without it these skip."""

import json
from pathlib import Path

import pytest

from harness.gpuci.plan import DURATIONS, SPLITTING_ALGORITHM

ROOT = Path(__file__).resolve().parents[2]
_TESTS = {f"t{i:02}": (1, 2, 3, 1.5)[i % 4] for i in range(40)}


def _shards(pytester, names, splits=3) -> list[list[str]]:
    pytest.importorskip("pytest_split", reason="pytest-split is the optional extra ci: make test-gpu installs it")
    pytester.makepyfile(test_many="\n".join(f"def test_{n}(): pass" for n in names))
    (pytester.path / "durations.json").write_text(json.dumps({f"test_many.py::test_{n}": d for n, d in _TESTS.items()}))
    shards = []
    for group in range(1, splits + 1):
        result = pytester.runpytest_inprocess("-p", "pytest_split", "--collect-only", "-q", f"--splits={splits}",
                                              f"--group={group}", "--durations-path=durations.json",
                                              f"--splitting-algorithm={SPLITTING_ALGORITHM}")
        shards.append([line.split("::test_")[1] for line in result.outlines if "::test_" in line])
    return shards


def test_every_item_lands_in_exactly_one_shard_the_same_on_every_run(pytester):
    shards = _shards(pytester, list(_TESTS))
    assert sorted(n for shard in shards for n in shard) == sorted(_TESTS)
    assert _shards(pytester, list(_TESTS)) == shards
    loads = [sum(_TESTS[n] for n in shard) for shard in shards]
    assert max(loads) - min(loads) <= max(_TESTS.values())  # balanced by the recorded durations


def test_a_test_added_without_a_duration_moves_only_tests_at_the_shards_edges(pytester):
    # contiguous slices of the collection: a new scenario shifts the boundaries by a test or so, where a greedy
    # packing (least_duration) moved 17 of these 40 tests to another shard
    names = list(_TESTS)
    before = {n: i for i, shard in enumerate(_shards(pytester, names)) for n in shard}
    after_shards = _shards(pytester, [*names[:20], "t99", *names[20:]])
    after = {n: i for i, shard in enumerate(after_shards) for n in shard}
    assert sorted(after) == sorted([*names, "t99"])
    assert sum(before[n] != after[n] for n in names) <= len(after_shards) - 1


def test_the_recorded_durations_are_pytest_splits_map_of_node_ids_to_seconds():
    durations = json.loads((ROOT / DURATIONS).read_text())
    assert durations and all(isinstance(v, (int, float)) and v >= 0 for v in durations.values())
    # every id names a file that exists, so a renamed file shows up here rather than as an unbalanced shard
    missing = sorted({k.split("::")[0] for k in durations if not (ROOT / k.split("::")[0]).exists()})
    assert missing == []


def test_the_dry_runs_shard_plan_is_the_split_the_plugin_makes_in_each_shard(pytester):
    from harness.gpuci.shards import lines, split

    names = list(_TESTS)
    by_plugin = _shards(pytester, names)
    durations = {f"test_many.py::test_{n}": d for n, d in _TESTS.items()}
    plan = split([f"test_many.py::test_{n}" for n in names], durations, splits=3, algorithm=SPLITTING_ALGORITHM)
    assert [[i.split("::test_")[1] for i in shard.items] for shard in plan] == by_plugin
    assert lines("graphs", plan)[1].startswith(f"     shard 1: {len(by_plugin[0])} items, ~")
