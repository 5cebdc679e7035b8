"""Real CUDA graphs: the cuda engine, and the tape engine on CUDA tensors, against eager."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from harness.graphs import CaptureError, eager_island, get_engine

from ._refusal_cases import CASES, state

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

ENGINES = ("tape", "cuda")


def _mini_program():
    gen = torch.Generator().manual_seed(0)
    prog = SimpleNamespace(
        x=torch.zeros(4, 64, device="cuda"),
        w=torch.randn(64, 64, generator=gen).cuda(),
        kv=torch.zeros(128, 64, device="cuda"),
        idx=torch.zeros(4, dtype=torch.int64, device="cuda"),
    )

    def fn():
        y = (prog.x @ prog.w).relu()
        prog.kv[prog.idx] = y
        return y

    return prog, fn


def test_mini_program_replays_match_eager_and_each_other_bitwise():
    rounds: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for engine in ENGINES:
        prog, fn = _mini_program()
        kv_before = prog.kv.clone()
        g = get_engine(engine).capture(
            fn, label=engine, roots={"prog": prog}, static_inputs=[prog.x, prog.w, prog.kv, prog.idx]
        )
        torch.cuda.synchronize()
        assert torch.equal(prog.kv, kv_before), f"{engine}: capture must not compute"
        assert torch.isnan(g.outputs[0]).all(), f"{engine}: static output holds poison before replay"
        assert g.audit.unregistered == ()
        gen = torch.Generator().manual_seed(1)
        rounds[engine] = []
        for _ in range(3):
            prog.x.copy_(torch.randn(4, 64, generator=gen))
            prog.idx.copy_(torch.randperm(128, generator=gen)[:4])
            expected_kv = prog.kv.clone()
            expected_y = (prog.x @ prog.w).relu()
            expected_kv[prog.idx] = expected_y
            assert g.replay() == ()
            torch.cuda.synchronize()
            assert torch.equal(g.outputs[0], expected_y), engine
            assert torch.equal(prog.kv, expected_kv), engine
            rounds[engine].append((g.outputs[0].clone(), prog.kv.clone()))
    for (y_tape, kv_tape), (y_cuda, kv_cuda) in zip(rounds["tape"], rounds["cuda"]):
        assert torch.equal(y_tape, y_cuda) and torch.equal(kv_tape, kv_cuda)


def _island_program():
    s = SimpleNamespace(x=torch.ones(8, device="cuda"), n=torch.tensor([3], device="cuda"))

    def plan(x, n):  # host-side: reads a device value, allowed only in an island
        k = int(n.item())
        return x[:k].sum().reshape(1), torch.arange(k, device=x.device).sum().reshape(1).float()

    def fn():
        h = s.x * 2
        total, tri = eager_island(plan, h, s.n)
        return h * total + tri

    return s, fn, plan


def test_islands_rerun_between_segments_on_both_engines():
    outs = {}
    for engine in ENGINES:
        s, fn, plan = _island_program()
        g = get_engine(engine).capture(fn, label=engine, roots={"s": s}, static_inputs=[s.x, s.n], islands=True)
        outs[engine] = []
        for k in range(3):
            s.x.copy_(torch.arange(8.0, device="cuda") + k)
            s.n.fill_(k + 2)
            g.replay()
            torch.cuda.synchronize()
            h = s.x * 2
            total, tri = plan(h, s.n)
            assert torch.equal(g.outputs[0], h * total + tri), engine
            outs[engine].append(g.outputs[0].clone())
    for a, b in zip(outs["tape"], outs["cuda"]):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "refused",
    [
        pytest.param(lambda t: t.sum().item(), id="item"),
        pytest.param(lambda t: t.cpu(), id="device-to-host"),
        pytest.param(lambda t: torch.nonzero(t), id="nonzero"),
        pytest.param(lambda t: t + torch.tensor([1.0], device="cuda"), id="torch.tensor"),
    ],
)
def test_capture_errors_agree_between_engines(refused):
    s = SimpleNamespace(x=torch.ones(4, device="cuda"))
    errors = []
    for engine in ENGINES:
        with pytest.raises(CaptureError) as info:
            get_engine(engine).capture(lambda: refused(s.x), label=engine, roots={}, static_inputs=[])
        errors.append((info.value.op, info.value.location))
    assert errors[0] == errors[1]
    assert "test_cuda_gpu.py:" in errors[0][1]
    # A failed capture leaves the device usable.
    g = get_engine("cuda").capture(lambda: s.x + 1, label="after", roots={}, static_inputs=[])
    g.replay()
    torch.cuda.synchronize()
    assert g.outputs[0].tolist() == [2.0] * 4


def test_audits_and_stale_reports_agree_between_engines():
    found = {}
    for engine in ENGINES:
        pool = SimpleNamespace(kv=torch.zeros(8, 4, device="cuda"), loc=torch.tensor([1, 5], device="cuda"))
        run = SimpleNamespace(x=torch.ones(2, 4, device="cuda"))

        def fn(pool=pool, run=run):
            pool.kv[pool.loc] = run.x * 3
            return pool.kv.sum(0)

        g = get_engine(engine).capture(
            fn, label=engine, roots={"pool": pool, "run": run}, static_inputs=[pool.kv, run.x]
        )
        pool.loc = torch.tensor([0, 2], device="cuda")
        found[engine] = (g.audit, [st.path for st in g.replay()])
    assert found["tape"] == found["cuda"]
    assert [i.path for i in found["cuda"][0].unregistered] == ["pool.loc"]
    assert found["cuda"][1] == ["pool.loc"]


def test_graphs_of_one_cuda_engine_share_its_pool_and_replay_independently():
    engine = get_engine("cuda")
    s = SimpleNamespace(x=torch.ones(4, device="cuda"))
    g2 = engine.capture(lambda: s.x * 2, label="x2", roots={}, static_inputs=[s.x])
    g3 = engine.capture(lambda: s.x * 3, label="x3", roots={}, static_inputs=[s.x])
    s.x.fill_(5.0)
    g2.replay()
    torch.cuda.synchronize()
    assert g2.outputs[0].tolist() == [10.0] * 4
    g3.replay()
    torch.cuda.synchronize()
    assert g3.outputs[0].tolist() == [15.0] * 4


def _bare_capture(case) -> str:
    """A bare torch.cuda.graph capture of the case's program, no harness involved: "refused" or "captured"."""
    s = state("cuda")
    try:
        case.program(s)  # warm-up: library handles and workspaces must not be created inside capture
    except Exception:  # noqa: BLE001 - the eager run may fail where capture will fail anyway (numpy of a CUDA tensor)
        pass
    s = state("cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            case.program(s)
    except Exception:  # noqa: BLE001 - whatever CUDA or torch raises, the program cannot be captured
        torch.cuda.synchronize()
        return "refused"
    torch.cuda.synchronize()
    return "captured"


def test_bare_cuda_capture_refuses_exactly_the_programs_the_refusal_table_refuses():
    """How the table in harness/graphs/_refusals.py is checked against CUDA itself."""
    wrong = [(c.id, "refused" if c.refused("cuda") else "captured", got)
             for c in CASES if (got := _bare_capture(c)) != ("refused" if c.refused("cuda") else "captured")]
    assert wrong == []


def test_cuda_engine_refuses_exactly_the_programs_the_refusal_table_refuses():
    wrong = []
    for case in CASES:
        s = state("cuda")
        try:
            get_engine("cuda").capture(lambda: _discard(case.program(s)), label=case.id, roots={}, static_inputs=[])
            got = "captured"
        except CaptureError:
            got = "refused"
        expected = "refused" if case.refused("cuda") else "captured"
        if got != expected:
            wrong.append((case.id, expected, got))
    assert wrong == []


def _discard(result: object) -> None:
    return None
