"""The recorded trace, and whole small programs checked bitwise against eager runs."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from harness.graphs import eager_island

from ._helpers import capture, twice


def _double(t: torch.Tensor) -> torch.Tensor:
    return t * 2


def test_trace_lists_each_recorded_step_and_what_replay_does():
    prog = SimpleNamespace(x=torch.ones(2, 3), w=torch.ones(3, 3), kv=torch.zeros(4, 3), idx=torch.tensor([0, 2]))

    def fn():
        h = (prog.x @ prog.w).relu()
        prog.kv[prog.idx] = h.t().t()
        scratch = torch.empty(2)
        z = eager_island(_double, h)
        t = torch.add(z.sum(-1), 1, out=scratch).clone()
        t.unsqueeze_(0)
        return (*torch.sort(h, dim=1), twice(t))

    g = capture(fn, roots={"prog": prog}, islands=True)
    assert g.trace() == "\n".join(
        [
            "aten.mm.default(prog.x, prog.w) -> t0  [out]",
            "aten.relu.default(t0) -> t1  [out]",
            "aten.t.default(t1) -> t2  [skip: view]",
            "aten.t.default(t2) -> t3  [skip: view]",
            "aten.index_put_.default(prog.kv, [prog.idx], t3) -> prog.kv  [rerun]",
            # the scratch buffer takes the memory of mm's result, dead once relu has read it
            "aten.empty.memory_format([2], device=cpu, pin_memory=False) -> t4  [skip: alloc, reuses t0]",
            "island _double(t1) -> t5  [island]",
            "aten.sum.dim_IntList(t5, [-1]) -> t6  [out]",
            "aten.add.out(t6, 1, out=t4) -> t4  [rerun]",
            "aten.clone.default(t4) -> t7  [out, reuses t6]",
            "aten.unsqueeze_.default(t7, 0) -> t7  [skip: inplace view]",
            "aten.sort.default(t1, 1) -> (t8, t9)  [out]",
            "harness_graphs_test.twice.default(t7) -> t10  [compute+copy, calls the op again]",
        ]
    )


def _mini_program():
    torch.manual_seed(0)
    prog = SimpleNamespace(
        x=torch.zeros(4, 8),
        w=torch.randn(8, 8),
        kv=torch.zeros(32, 8),
        idx=torch.zeros(4, dtype=torch.int64),
    )

    def fn():
        y = (prog.x @ prog.w).relu()
        prog.kv[prog.idx] = y
        return y

    return prog, fn


def test_mini_program_replay_matches_eager_bitwise():
    prog, fn = _mini_program()
    static = [prog.x, prog.w, prog.kv, prog.idx]
    g = capture(fn, roots={"prog": prog}, static=static)
    assert g.audit.unregistered == ()
    (y,) = g.outputs
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        prog.x.copy_(torch.randn(4, 8, generator=gen))
        prog.idx.copy_(torch.randperm(32, generator=gen)[:4])
        expected_kv = prog.kv.clone()
        expected_y = (prog.x @ prog.w).relu()
        expected_kv[prog.idx] = expected_y
        assert g.replay() == ()
        assert g.outputs[0] is y
        assert torch.equal(y, expected_y)
        assert torch.equal(prog.kv, expected_kv)


def test_layer_stack_with_island_matches_eager():
    torch.manual_seed(0)
    m = SimpleNamespace(
        x=torch.randn(3, 16),
        ws=[torch.randn(16, 16) * 0.2 for _ in range(4)],
        norm=torch.nn.LayerNorm(16),
        lens=torch.tensor([1, 2, 3]),
    )

    def plan(lens):  # host-side planning: fine in an island, refused in a graph
        return torch.arange(int(lens.max().item()) + 1).float().sum().reshape(1)

    def body(extra):
        with torch.no_grad():
            h = m.x
            for w in m.ws:
                h = torch.nn.functional.gelu(m.norm(h @ w)) + h
            return h.softmax(-1) * extra

    g = capture(lambda: body(eager_island(plan, m.lens)), roots={"m": m}, islands=True)
    for k in range(3):
        m.x.copy_(torch.randn(3, 16))
        m.lens.fill_(k + 4)
        g.replay()
        expected = body(plan(m.lens))
        assert torch.equal(g.outputs[0], expected)
