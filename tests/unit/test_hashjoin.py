"""The hash join of rows finds every pair of equal rows whatever the hashes say, and none across blocks."""

import ast
from pathlib import Path

import torch

from harness.check.diff import hashjoin
from harness.check.diff.hashjoin import Rows, Scratch, hash_hits, match, words


def _pairs(found, queries: int) -> set[tuple[int, int]]:
    """(hay position, query position) of every match."""
    of_group: dict[int, list[int]] = {}
    for h, g in zip(found.hay.tolist(), found.group.tolist()):
        of_group.setdefault(g, []).append(h)
    return {(h, q) for q, g in enumerate(found.of_query.tolist()) for h in of_group.get(g, ())}


def _table(gen, rows: int, parts: int, palette: int):
    """``parts`` word tensors whose rows are drawn from a small palette, so that many rows repeat, some
    only in their first part."""
    colours = [torch.randint(-2**31, 2**31, (palette, 6), generator=gen, dtype=torch.int64).to(torch.int32)
               for _ in range(parts)]
    pick = [torch.randint(0, palette, (rows,), generator=gen) for _ in range(parts)]
    pick[1:] = [torch.where(torch.rand(rows, generator=gen) < 0.7, pick[0], p) for p in pick[1:]]
    return tuple(c[p] for c, p in zip(colours, pick))


def _brute(parts, index, block_rows) -> set[tuple[int, int]]:
    rows = [tuple(tuple(p[r].tolist()) for p in parts) for r in range(parts[0].shape[0])]
    return {(h, q) for q, r in enumerate(index.tolist()) for h in range(len(rows))
            if rows[h] == rows[r] and h // block_rows == r // block_rows}


def test_match_finds_every_equal_row_of_a_three_part_table_even_when_every_hash_collides(monkeypatch):
    gen = torch.Generator().manual_seed(4)
    parts = _table(gen, 240, 3, palette=5)
    index = torch.randperm(240, generator=gen)[:60]
    want = _brute(parts, index, 80)
    assert len(want) > 60  # rows repeat, so queries have several matches each
    assert _pairs(match(Rows(parts, None, 80), Rows(parts, index, 80), scratch=Scratch()), 60) == want
    monkeypatch.setattr(hashjoin, "line_hash", lambda w, rows=None: torch.zeros(
        w.shape[0] if rows is None else rows.numel(), dtype=torch.int64))
    monkeypatch.setattr(hashjoin, "row_hash", lambda w: torch.zeros(w.shape[0], dtype=torch.int64))
    assert _pairs(match(Rows(parts, None, 80), Rows(parts, index, 80), scratch=Scratch()), 60) == want


def test_equal_rows_of_different_blocks_never_join_even_when_their_hashes_do(monkeypatch):
    row = torch.arange(8, dtype=torch.int64).view(1, 8)
    parts = (row.expand(6, 8).clone(),)  # six equal rows, two blocks of three
    want = {(0, 0), (1, 0), (2, 0), (3, 1), (4, 1), (5, 1)}
    assert _pairs(match(Rows(parts, None, 3), Rows(parts, torch.tensor([1, 4]), 3), scratch=Scratch()), 2) == want
    monkeypatch.setattr(hashjoin, "_BLOCK_SALT", 0)  # the salt no longer keeps the blocks' hashes apart
    assert _pairs(match(Rows(parts, None, 3), Rows(parts, torch.tensor([1, 4]), 3), scratch=Scratch()), 2) == want


def test_hash_lookup_finds_every_equal_pair_also_in_buckets_that_keys_share():
    gen = torch.Generator().manual_seed(1)
    base = torch.randint(-2**62, 2**62, (300,), generator=gen)
    # keys equal in their low 40 bits share a bucket in any table this lookup builds
    keys = torch.unique(torch.cat([base, base[:60] + (1 << 40), base[:60] + (2 << 40)]))
    hashes = torch.cat([keys[torch.randint(0, keys.numel(), (3_000,), generator=gen)],
                        torch.randint(-2**62, 2**62, (5_000,), generator=gen), base[:60] + (3 << 40)])
    rows, key = hash_hits(keys, hashes, scratch=Scratch())
    want = {(i, int((keys == h).nonzero())) for i, h in enumerate(hashes.tolist()) if bool((keys == h).any())}
    assert set(zip(rows.tolist(), key.tolist())) == want and rows.numel() == len(want)


def test_words_compare_bits_so_nan_equals_itself_and_negative_zero_differs():
    a = torch.tensor([[[float("nan"), 0.0]]])
    b = torch.tensor([[[float("nan"), -0.0]]])
    assert hashjoin.rows_differ(words(a), words(a.clone()), scratch=Scratch()).tolist() == [False]
    assert hashjoin.rows_differ(words(a), words(b), scratch=Scratch()).tolist() == [True]


def test_the_engine_imports_nothing_of_the_harness():
    source = Path(hashjoin.__file__).read_text()
    imported = {a.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Import) for a in node.names}
    imported |= {node.module or "." for node in ast.walk(ast.parse(source))
                 if isinstance(node, ast.ImportFrom) and (node.level or node.module)}
    assert imported <= {"__future__", "math", "dataclasses", "torch"}, imported
