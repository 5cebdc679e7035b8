"""What replay runs, and in which memory.

Like a CUDA graph's private pool, the tape lets a later intermediate take the memory of one
whose last reader has run, never the memory of an output, of an island's static, of anything
the program still holds, and never splitting a view from its base.  Ops whose results nothing
reads are not replayed at all.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from harness.graphs import eager_island

from ._helpers import OpLog, capture


def _chain(s: SimpleNamespace) -> torch.Tensor:
    a = s.x + 1  # dead once b is computed
    b = a * 2
    c = b - 3  # may take a's memory
    return c * c


def test_later_intermediate_takes_the_memory_of_one_whose_last_reader_has_run():
    s = SimpleNamespace(x=torch.arange(8.0))
    g = capture(lambda: _chain(s))
    assert g.trace().splitlines()[2] == "aten.sub.Tensor(t1, 3) -> t2  [out, reuses t0]"
    for k in range(3):
        s.x.copy_(torch.randn(8))
        g.replay()
        assert torch.equal(g.outputs[0], _chain(s)), k


def test_op_whose_result_nothing_reads_is_not_replayed():
    s = SimpleNamespace(x=torch.arange(4.0))

    def fn():
        unused = s.x.exp()  # computed by the program, read by nothing
        del unused
        return s.x * 2

    g = capture(fn, roots={"s": s})
    with OpLog() as log:
        g.replay()
    assert log.ops == ["aten.mul.out"]
    assert g.trace().splitlines()[0] == "aten.exp.default(s.x) -> t0  [skip: dead]"
    assert g.outputs[0].tolist() == [0.0, 2.0, 4.0, 6.0]


def test_intermediate_the_program_still_holds_keeps_its_memory_and_its_values():
    s = SimpleNamespace(x=torch.arange(8.0))
    kept = {}

    def fn():
        kept["a"] = held = s.x + 1  # the program keeps it: replay must keep it current
        other = s.x * 5  # dead after the next line: its memory is free to take
        b = held * 2 + other
        c = b - 3
        return c * c

    g = capture(fn)
    trace = g.trace()
    assert "reuses t1" in trace  # `other`'s memory is reused...
    assert "reuses t0" not in trace  # ...the held tensor's is not
    s.x.copy_(torch.arange(8.0) * 3)
    g.replay()
    assert torch.equal(kept["a"], s.x + 1)
    assert torch.equal(g.outputs[0], ((s.x + 1) * 2 + s.x * 5 - 3) ** 2)


def test_outputs_and_island_statics_keep_their_memory():
    s = SimpleNamespace(x=torch.arange(8.0))

    def fn():
        out = s.x + 1  # an output: never reused though nothing reads it after
        static = eager_island(lambda t: t * 2, s.x)  # an island's static: never reused either
        dead = static * 3
        y = dead + 1
        w = y * 2  # may take `dead`'s memory, not `out`'s or `static`'s
        return out, w * out

    g = capture(fn, islands=True)
    trace = g.trace()
    assert "reuses t2" in trace
    assert "reuses t0" not in trace and "reuses t1" not in trace
    s.x.copy_(torch.arange(8.0) - 4)
    g.replay()
    out, z = g.outputs
    assert torch.equal(out, s.x + 1)
    assert torch.equal(z, (s.x * 2 * 3 + 1) * 2 * (s.x + 1))


def test_reused_memory_keeps_a_view_with_its_base():
    s = SimpleNamespace(x=torch.arange(16.0).view(4, 4))

    def fn():
        a = s.x * 2  # dead after v's last read: a and its view v free their memory together
        v = a[1:3].t()
        b = v + 1
        c = b * 3  # may take a's memory
        d = c[:, ::2]  # a view of c: must live in c's memory
        return d * 1, (b * 0).sum()

    g = capture(fn)
    assert "reuses t0" in g.trace()
    for k in range(3):
        s.x.copy_(torch.randn(4, 4))
        g.replay()
        expected = (((s.x * 2)[1:3].t() + 1) * 3)[:, ::2]
        assert torch.equal(g.outputs[0], expected), k


def test_an_op_without_a_public_out_binding_replays_through_its_functional_binding_into_its_output():
    # torch.roll over two dimensions and a clone take no out= in Python: their .out overloads are reachable
    # only through the boxed call, which costs more than the op; replay computes the roll and copies the
    # clone's source straight in
    s = SimpleNamespace(x=torch.arange(6.0).reshape(2, 3))

    def fn():
        return torch.roll(s.x * 2, (1, 1), (0, 1)), (s.x + 1).t().clone()

    g = capture(fn, roots={"s": s})
    with OpLog() as log:
        g.replay()
    assert log.ops == ["aten.mul.out", "aten.roll.default", "aten.copy_.default", "aten.add.out",
                       "aten.copy_.default"]
    for k in range(3):
        s.x.copy_(torch.randn(2, 3))
        g.replay()
        rolled, cloned = fn()
        assert torch.equal(g.outputs[0], rolled) and torch.equal(g.outputs[1], cloned), k
        assert g.outputs[1].stride() == cloned.stride()


def test_replay_runs_its_ops_from_a_list_then_from_one_generated_function_per_segment():
    from harness.graphs.tape import COMPILE_AFTER

    s = SimpleNamespace(x=torch.arange(4.0))
    g = capture(lambda: (s.x * 2).relu() + 1, roots={"s": s})
    assert g._segments is None  # nothing bound before the first replay
    for k in range(COMPILE_AFTER + 2):
        s.x.fill_(float(k % 3) - 1.0)
        g.replay()
        assert g.outputs[0].tolist() == [max(0.0, 2 * (k % 3) - 2.0) + 1.0] * 4, k
        ((run, island),) = g._segments
        assert island is None
        assert run.__code__.co_filename == "<tape replay>"
        assert ("OPS" in run.__globals__) == (k < COMPILE_AFTER), k  # the listed loop, then the generated code


def test_the_input_watch_reports_the_same_before_and_after_its_probe_is_compiled():
    from harness.graphs.tape import COMPILE_AFTER

    s = SimpleNamespace(x=torch.arange(4.0), y=torch.ones(4))
    g = capture(lambda: s.x * s.y, roots={"s": s})
    seen = []
    for k in range(2 * COMPILE_AFTER + 2):
        if k % 4 == 1:
            s.x.add_(1.0)  # a refresh in place: no finding
        if k % 4 == 2:
            s.y = torch.zeros(4)  # the path reaches another tensor: a rebound input
        if k % 4 == 3:
            s.y = g.reads[1]  # back to the captured one
        seen.append([(st.path, st.kind, st.benign) for st in g.replay()])
    listed, compiled = seen[:COMPILE_AFTER], seen[COMPILE_AFTER:2 * COMPILE_AFTER]
    assert listed == compiled and any(listed) and not all(listed)


def test_an_op_that_fails_at_replay_names_the_same_frames_from_the_list_and_from_the_compiled_function():
    # results records keep an error's frames: which form the replay ran in must not show in them
    from harness.check.run.frames import subject_frames
    from harness.graphs.tape import COMPILE_AFTER

    s = SimpleNamespace(x=torch.arange(4.0), i=torch.tensor([1]))
    g = capture(lambda: (s.x * 2 + 1).index_select(0, s.i), roots={"s": s})
    seen = []
    for k in range(COMPILE_AFTER + 2):
        s.i.fill_(7 if k % 2 else 1)  # out of bounds every other replay
        try:
            g.replay()
        except IndexError as exc:
            seen.append((k, [(f.file, f.line, f.function) for f in subject_frames(exc.__traceback__)][-1]))
    assert [k for k, _ in seen] == list(range(1, COMPILE_AFTER + 2, 2))
    assert {frame for _, frame in seen} == {("<tape replay>", 4, "run")}  # the third op, on line 4 of either
