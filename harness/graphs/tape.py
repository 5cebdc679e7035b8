"""The ``tape`` engine: a CPU-runnable model of CUDA-graph capture and replay.

Design
======

A CUDA graph records kernels, not Python.  Replaying it re-launches the same
kernels on the same device addresses.  Everything that made a *decision* at
capture (a branch, a Python number, an attribute read) is frozen; everything that
is *memory* (a tensor's contents) is live.  The tape reproduces exactly that split
by recording aten ops and replaying them on the very tensor objects they touched.

Capture runs the callable once under a ``Recorder`` (``_record.py``): a
``TorchDispatchMode`` that sees every aten op below autograd, plus a
``TorchFunctionMode`` for host reads that dispatch no op (``Tensor.tolist``).
For each op the recorder

1. refuses what CUDA refuses during stream capture (host syncs, data-dependent
   output sizes, tensors built from Python data) with a ``CaptureError`` naming the
   op and the user's source line;
2. snapshots a pre-existing storage before the first write to it, so capture can
   be undone at the end ("capture does not compute");
3. runs the op for real, so that the Python that follows sees real values and
   takes the branches it would take eagerly;
4. notes which outputs are fresh storage and which alias an input, and appends
   the call to the tape.

At capture end the snapshots are restored, every capture-allocated storage is
filled with poison (NaN, a negative sentinel, True) until the first replay, the
input audit is built (``_audit.py``), and the tape is compiled into a flat list of
``(callable, args, kwargs)`` triples, one per op that does work at replay:

* views (the output shares storage with an input, nothing written) are free;
* pure allocations (``empty*``, ``new_empty*``) are not re-run: like graph memory,
  the buffer keeps whatever the previous replay left in it;
* in-place and ``out=`` ops are re-run as recorded;
* every other op is redirected into the tensor captured as its output through the
  op's ``.out`` overload (found by schema), else computed and ``copy_``-ed in;
* an eager island splits the tape: its Python re-runs between the pieces and its
  results are copied into the static tensors capture handed out.

Replay is then a tight loop below autograd, with no Python decisions, no
allocations and no clones; the only other work is re-resolving the audited
attribute paths to report stale (rebound) inputs.

Known simplifications: the tape keeps every capture output alive (a CUDA
graph's private pool would reuse dead intermediates), which costs memory, not
correctness; and an island's capture-time write to a storage that a captured op
also wrote is rolled back with that op's write, since undo works per storage.

Example trace
-------------

For ``y = (prog.x @ prog.w).relu(); prog.kv[prog.idx] = y; return y``::

    aten.mm.default(prog.x, prog.w) -> t0  [out]
    aten.relu.default(t0) -> t1  [out]
    aten.index_put_.default(prog.kv, [prog.idx], t1) -> prog.kv  [rerun]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ._audit import StaleWatch, build_audit
from ._record import (
    IslandStep,
    OpStep,
    Recorder,
    flat_outputs,
    island_outputs,
    island_runner,
    static_outputs,
)
from .engine import InputAudit, StaleInput

__all__ = ["TapeEngine", "TapeGraph"]

_Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]
_OPTION_ARGS = frozenset({"dtype", "layout", "device", "pin_memory"})
_ALLOC_PREFIXES = ("empty", "new_empty")
# Replayed ops were recorded below autograd and ADInplaceOrView; replaying at the
# same level skips autograd bookkeeping (and, like a CUDA graph, version counters).
_below_autograd = torch._C._AutoDispatchBelowADInplaceOrView


# ---------------------------------------------------------------- .out overloads


@dataclass(frozen=True, slots=True)
class _OutPlan:
    op: Any
    positional: tuple[tuple[str, bool, Any], ...]  # (name, has_default, default)
    keywords: tuple[str, ...]
    outs: tuple[str, ...]
    list_out: bool  # the op returns one Tensor[]; its out argument takes the list


_PLANS: dict[Any, _OutPlan | None] = {}


def _out_plan(func: Any) -> _OutPlan | None:
    """The ``.out`` overload computing ``func`` into given tensors, matched by schema."""
    if func in _PLANS:
        return _PLANS[func]
    schema = func._schema
    ret_types = [str(r.type) for r in schema.returns]
    ours = {a.name: str(a.type) for a in schema.arguments}
    best: tuple[int, str, _OutPlan] | None = None
    packet = func.overloadpacket
    for overload_name in sorted(packet.overloads()):
        cand = getattr(packet, overload_name)
        if cand is func:
            continue
        args = cand._schema.arguments
        outs = [a for a in args if a.is_out]
        if not outs or [str(a.type) for a in outs] != ret_types:
            continue
        ins = [a for a in args if not a.is_out]
        extras = 0
        ok = True
        for a in ins:
            if a.name in ours:
                ok = ok and ours[a.name] == str(a.type)
            elif a.has_default_value():
                extras += 1
            else:
                ok = False
        dropped = set(ours) - {a.name for a in ins}
        if not ok or not dropped <= _OPTION_ARGS:
            continue
        plan = _OutPlan(
            op=cand,
            positional=tuple((a.name, a.has_default_value(), a.default_value) for a in ins if not a.kwarg_only),
            keywords=tuple(a.name for a in ins if a.kwarg_only),
            outs=tuple(a.name for a in outs),
            list_out=ret_types == ["List[Tensor]"],
        )
        if best is None or (extras, overload_name) < best[:2]:
            best = (extras, overload_name, plan)
    plan = best[2] if best is not None else None
    _PLANS[func] = plan
    return plan


def _bind_out(plan: _OutPlan, step: OpStep) -> _Call | None:
    values: dict[str, Any] = dict(step.kwargs)
    for a, v in zip(step.func._schema.arguments, step.args):
        values[a.name] = v
    positional: list[Any] = []
    pending: list[Any] = []  # defaults that only matter if a later positional is given
    for name, has_default, default in plan.positional:
        if name in values:
            positional.extend(pending)
            pending.clear()
            positional.append(values[name])
        elif has_default:
            pending.append(default)
        else:
            return None
    kwargs = {k: values[k] for k in plan.keywords if k in values}
    if plan.list_out:
        kwargs[plan.outs[0]] = list(step.outputs)
    else:
        kwargs.update(zip(plan.outs, step.outputs))
    return (getattr(plan.op, "_op", plan.op), tuple(positional), kwargs)


# ---------------------------------------------------------------- compile


def _compute_then_copy(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], targets: tuple[tuple[int, torch.Tensor], ...]) -> Callable[[], None]:
    call = getattr(func, "_op", func)

    def run() -> None:
        flat = flat_outputs(call(*args, **kwargs))
        for i, static in targets:
            static.copy_(flat[i])

    return run




def _plan_op(step: OpStep) -> tuple[_Call | None, str]:
    """What replay does for one recorded op, and the trace note saying so."""
    func, info = step.func, step.info
    if info.inplace_view:
        return None, "skip: inplace view"
    tensor_outs = [i for i, t in enumerate(step.outputs) if isinstance(t, torch.Tensor)]
    fresh_outs = tuple((i, step.outputs[i]) for i in tensor_outs if step.fresh[i])
    call = getattr(func, "_op", func)
    if info.writes or not func._schema.returns:  # mutations and pure effects (asserts)
        if fresh_outs:
            return (_compute_then_copy(func, step.args, step.kwargs, fresh_outs), (), {}), "rerun+copy"
        return (call, step.args, step.kwargs), "rerun"
    if not tensor_outs:
        return None, "skip: no tensor output"
    if not fresh_outs:
        empty = all(step.outputs[i].untyped_storage().nbytes() == 0 for i in tensor_outs)
        return None, "skip: empty" if empty else "skip: view"
    if info.name.split("::", 1)[1].startswith(_ALLOC_PREFIXES):
        return None, "skip: alloc"
    if len(fresh_outs) == len(step.outputs):
        plan = _out_plan(func)
        bound = _bind_out(plan, step) if plan is not None else None
        if bound is not None:
            return bound, "out"
    return (_compute_then_copy(func, step.args, step.kwargs, fresh_outs), (), {}), "compute+copy"


_Segment = tuple[tuple[_Call, ...], Callable[[], None] | None]


def _compile(steps: list[OpStep | IslandStep]) -> tuple[tuple[_Segment, ...], tuple[str, ...]]:
    segments: list[_Segment] = []
    notes: list[str] = []
    ops: list[_Call] = []
    for step in steps:
        if isinstance(step, IslandStep):
            segments.append((tuple(ops), island_runner(step)))
            ops = []
            notes.append("island")
            continue
        call, note = _plan_op(step)
        if call is not None:
            ops.append(call)
        notes.append(note)
    if ops or not segments:
        segments.append((tuple(ops), None))
    return tuple(segments), tuple(notes)


# ---------------------------------------------------------------- trace text


class _Namer:
    def __init__(self, inputs: Iterable[torch.Tensor], audit: InputAudit, aliases: Mapping[int, torch.Tensor]) -> None:
        self._names: dict[int, str] = {}
        self._keep: list[torch.Tensor] = []
        self._aliases = aliases
        for k, (t, entry) in enumerate(zip(inputs, audit.inputs)):
            self._bind(t, entry.path or f"in{k}")
        self._next_t = 0
        self._next_c = 0

    def _bind(self, t: torch.Tensor, name: str) -> str:
        self._names[id(t)] = name
        self._keep.append(t)  # ids must stay unique while naming
        return name

    def name(self, t: torch.Tensor, *, produced: bool = False) -> str:
        original = self._aliases.get(id(t))
        if original is not None:  # a metadata-frozen stand-in reads as the tensor it stands for
            return self.name(original, produced=produced)
        found = self._names.get(id(t))
        if found is not None:
            return found
        if produced:
            self._next_t += 1
            return self._bind(t, f"t{self._next_t - 1}")
        self._next_c += 1
        return self._bind(t, f"c{self._next_c - 1}")

    def value(self, v: Any) -> str:
        if isinstance(v, torch.Tensor):
            return self.name(v)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(self.value(x) for x in v) + "]"
        if isinstance(v, (torch.dtype, torch.layout, torch.memory_format, torch.device)):
            return str(v)
        return repr(v)

    def call(self, head: str, args: tuple[Any, ...], kwargs: dict[str, Any], outputs: tuple[Any, ...] | None) -> str:
        parts = [self.value(a) for a in args] + [f"{k}={self.value(v)}" for k, v in kwargs.items()]
        text = f"{head}({', '.join(parts)})"
        if outputs:
            named = [self.name(t, produced=True) if isinstance(t, torch.Tensor) else repr(t) for t in outputs]
            text += " -> " + (named[0] if len(named) == 1 else "(" + ", ".join(named) + ")")
        return text


# ---------------------------------------------------------------- engine


class TapeGraph:
    """A captured tape; ``replay()`` re-runs it on the captured tensors."""

    def __init__(
        self,
        *,
        label: str,
        audit: InputAudit,
        watch: StaleWatch,
        segments: tuple[_Segment, ...],
        steps: tuple[OpStep | IslandStep, ...],
        notes: tuple[str, ...],
        inputs: tuple[torch.Tensor, ...],
        outputs: tuple[torch.Tensor, ...],
        aliases: Mapping[int, torch.Tensor],
    ) -> None:
        self.label = label
        self.audit = audit
        self._watch = watch
        self._segments = segments
        self._steps = steps
        self._notes = notes
        self._inputs = inputs
        self._outputs = outputs
        self._aliases = aliases

    @property
    def outputs(self) -> tuple[torch.Tensor, ...]:
        """The static outputs ``fn`` returned at capture (the same objects forever)."""
        return self._outputs

    def replay(self) -> tuple[StaleInput, ...]:
        stale = self._watch.check()
        for ops, island in self._segments:
            with _below_autograd():
                for call, args, kwargs in ops:
                    call(*args, **kwargs)
            if island is not None:
                island()
        return stale

    def trace(self) -> str:
        """One line per recorded step: the call, its outputs, and what replay does."""
        namer = _Namer(self._inputs, self.audit, self._aliases)
        lines = []
        for step, note in zip(self._steps, self._notes):
            if isinstance(step, IslandStep):
                head = f"island {getattr(step.fn, '__qualname__', repr(step.fn))}"
                text = namer.call(head, step.args, step.kwargs, step.statics)
            else:
                outs = step.outputs if step.func._schema.returns else None
                text = namer.call(str(step.func), step.args, step.kwargs, outs)
            lines.append(f"{text}  [{note}]")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"TapeGraph(label={self.label!r}, steps={len(self._steps)})"


def _tape_island(rec: Recorder, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    with rec.paused():
        result = fn(*args, **kwargs)
        tensors, single = island_outputs(fn, result)
        with torch.no_grad():
            statics = tuple(t.detach().clone() for t in tensors)
    rec.adopt_fresh(statics)
    rec.steps.append(IslandStep(fn, args, dict(kwargs), statics, single))
    return statics[0] if single else statics




class TapeEngine:
    name = "tape"

    def capture(
        self,
        fn: Callable[[], object],
        *,
        label: str,
        roots: Mapping[str, object],
        static_inputs: Iterable[torch.Tensor],
        islands: bool = False,
    ) -> TapeGraph:
        static = tuple(static_inputs)
        rec = Recorder(check=True, undo=True, record=True, island_impl=_tape_island if islands else None)
        ok = False
        try:
            with rec.active():
                result = fn()
            outputs = static_outputs(result)
            ok = True
        finally:
            rec.restore()
            if ok:
                rec.poison_fresh()
        inputs = tuple(rec.inputs.values())
        audit, watch = build_audit(inputs, roots, static)
        segments, notes = _compile(rec.steps)
        return TapeGraph(
            label=label,
            audit=audit,
            watch=watch,
            segments=segments,
            steps=tuple(rec.steps),
            notes=notes,
            inputs=inputs,
            outputs=outputs,
            aliases=dict(rec.aliases),
        )
