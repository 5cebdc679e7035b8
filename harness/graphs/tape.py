"""The ``tape`` engine: a CPU-runnable model of CUDA-graph capture and replay.

Design
======

A CUDA graph records kernels, not Python.  Replaying it re-launches the same
kernels on the same device addresses.  Everything that made a *decision* at
capture (a branch, a Python number, an attribute read) is frozen; everything that
is *memory* (the bytes at an address) is live.  The tape reproduces exactly that
split by recording aten ops and replaying them on the memory they touched.

Capture follows the protocol of the ``cuda`` engine and of serving engines'
graph runners.  First ``WARMUP_RUNS`` real eager runs (``_warm_up.warm_up``),
checked like capture, islands run eagerly, their writes kept.  A program that
caches something in Python during warm-up (a memo keyed on a tensor's
``data_ptr``, a flag saying a table is filled) then captures against that cache,
and the tape freezes the cached tensor as an input, as a real graph would.  Then
the capture run, under a ``Recorder`` (``_record.py``): a ``TorchDispatchMode``
that sees every aten op below autograd (a ``torch.library`` op through the ops
its body dispatches), plus wrappers around the Python-level calls that dispatch
none (``.tolist()``, ``torch.from_numpy``, printing).  While it runs,
``torch.cuda.is_current_stream_capturing()`` answers True (``_cuda_queries.py``).
For each op the recorder

1. refuses what CUDA refuses during stream capture, by the one table in
   ``_refusals.py``, with a ``CaptureError`` naming the op and the user's line;
2. snapshots a pre-existing storage before the first write to it, so capture can
   be undone at the end ("capture does not compute");
3. runs the op for real, so that the Python that follows sees real values and
   takes the branches it would take eagerly;
4. appends the call to the tape with every tensor replaced by a *pin*: a tensor
   object of the tape's own over the same storage, with the layout of that
   moment.  A pin binds memory, not the program's Python object, so a program
   that later re-points a tensor (``t.data = ...``, ``set_``, ``t_()``) does not
   move the tape, as it would not move a CUDA graph.  Where a pin would follow
   the program (a storage reallocated in place by ``resize_``), the pins move to
   a block of the tape's own that stands for the freed one: during capture for
   the steps before the op (and the copy of the old block into the new one is
   recorded, as CUDA captures it), after capture before a replay (``_homes.py``).

At capture end the snapshots are restored, the input audit is built
(``_audit.py``) and the tape is compiled into a flat list of ``(callable, args,
kwargs)`` triples, one per op that does work at replay:

* views (the output shares storage with an input, nothing written) are free;
* pure allocations (``empty*``, ``new_empty*``) are not re-run: like graph memory,
  the buffer keeps whatever the previous replay left in it;
* in-place and ``out=`` ops are re-run as recorded;
* every other op is redirected into the tensor captured as its output through the
  op's ``.out`` overload (found by schema), else computed and ``copy_``-ed in; an op
  that only moves data and whose ``.out`` only the boxed call reaches (a gather by
  one index tensor, a roll, a constant pad, a masked fill) runs as cheaper calls
  that leave the same bytes (``_replay_ops.py``);
* ops whose results nothing reads (not a later op, not an output, not a tensor
  the program still holds) are dropped;
* memory is pooled as a graph's private pool pools it: a storage allocated during
  capture that the program no longer holds is *private*; once the last op reading
  a private storage has run, a later private allocation may take its memory
  (storage by storage, so views move with their base; never the memory of an
  output, an island's static or anything the program holds);
* each op runs through the public torch binding that dispatches exactly the
  recorded overload (checked once per signature by intercepting the dispatch),
  which is cheaper than calling the ``OpOverload``;
* the calls are bound at the first replay (a graph never replayed does not pay
  for it) and run from a list; at replay ``COMPILE_AFTER`` each segment's calls
  are compiled into one generated function (``_flat``), which only a graph
  replayed often repays;
* an eager island splits the tape: its Python re-runs between the pieces and its
  results are copied into the static tensors capture handed out.

After compiling, every storage allocated during capture is filled with poison
(NaN, a negative sentinel, True) until the first replay: graph memory holds no
computed value.

Replay is then a tight loop below autograd, with no Python decisions, no
allocations and no clones.  Before it, the input audit checks in a few
microseconds that the attributes the graph read still hold the tensors it
captured and that those tensors still sit where they sat (``StaleInput``).

Known simplification: an island's capture-time write to a storage that a
captured op also wrote is rolled back with that op's write, since undo works per
storage.

Example trace
-------------

For ``y = (prog.x @ prog.w).relu(); prog.kv[prog.idx] = y; return y``::

    aten.mm.default(prog.x, prog.w) -> t0  [out]
    aten.relu.default(t0) -> t1  [out]
    aten.index_put_.default(prog.kv, [prog.idx], t1) -> prog.kv  [rerun]

A step whose output takes over the memory of a dead intermediate says so
(``[out, reuses t0]``).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import keyword
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ._audit import StaleWatch, build_audit
from ._homes import Homes
from ._islands import island_outputs, island_runner, static_outputs
from ._ops import StorageKey, flat_outputs, poison_storage, storage_key
from ._record import IslandStep, OpStep, Recorder, check_capture_error_mode
from ._replay_ops import masked_fill_by_copy, pad_by_fill, roll_by_copies, rows_gather
from ._refusals import CaptureError
from ._tape_device import NAMES, TapeDevice, TapeDeviceState, TapePool, refuse_default_stream
from ._warm_up import WarmIslands, no_cycle_collection, warm_up
from .engine import InputAudit, StaleInput
from .region import GraphRun, open_run

__all__ = ["TapeCapture", "TapeEngine", "TapeGraph", "TapePool"]

_Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]
_OPTION_ARGS = frozenset({"dtype", "layout", "device", "pin_memory"})
# Replayed ops were recorded below autograd and ADInplaceOrView; replaying at the
# same level skips autograd bookkeeping (and, like a CUDA graph, version counters).
_below_autograd = torch._C._AutoDispatchBelowADInplaceOrView


# ---------------------------------------------------------------- fastest callables


class _Stop(Exception):
    pass


class _Probe(TorchDispatchMode):
    """Sees the first op a call dispatches, and stops it before it runs."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __init__(self) -> None:
        super().__init__()
        self.seen: tuple[Any, tuple[Any, ...], dict[str, Any]] | None = None

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        self.seen = (func, args, kwargs or {})
        raise _Stop


_NAMESPACES = (
    torch._C._VariableFunctions, torch._C.TensorBase, torch._C._nn, torch._C._linalg, torch._C._special, torch._C._fft,
)
_FAST: dict[Any, tuple[Any, Callable[..., Any]]] = {}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _fast_callable(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[..., Any]:
    """The public binding that dispatches exactly ``op`` for these arguments, else the op itself.

    A binding parses Python arguments straight into a typed C++ call; an ``OpOverload`` goes
    through the boxed, schema-driven path and is markedly slower.  Which binding overload
    Python picks depends only on the arguments' types, so one probe per type signature is enough
    (a list argument's element types are fixed by the op's schema).
    """
    signature = (id(op), tuple(map(type, args)), tuple(zip(kwargs, map(type, kwargs.values()))) if kwargs else ())
    found = _FAST.get(signature)
    if found is None or found[0] is not op:
        found = (op, _probe_bindings(op, args, kwargs) or getattr(op, "_op", op))
        _FAST[signature] = found
    return found[1]


def _probe_bindings(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[..., Any] | None:
    name = op.overloadpacket.__name__
    for namespace in _NAMESPACES:
        candidate = getattr(namespace, name, None)
        if candidate is None:
            continue
        probe = _Probe()
        try:
            with probe:
                candidate(*args, **kwargs)
        except _Stop:
            pass
        except Exception:  # noqa: BLE001 - a binding that does not take these arguments
            continue
        seen = probe.seen
        if seen is not None and seen[0] is op and _same(seen[1], args) and _same(seen[2], kwargs):
            return candidate
    return None


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


_Binder = tuple[tuple[tuple[int, Any], ...], tuple[tuple[str, int, Any], ...]]
_BINDERS: dict[tuple[int, int, tuple[str, ...]], tuple[Any, _Binder | None]] = {}
_ARG, _KW, _DEFAULT = 0, 1, 2


def _binder(plan: _OutPlan, step: OpStep) -> _Binder | None:
    """Where each argument of the ``.out`` call comes from, for calls shaped like ``step``."""
    key = (id(step.func), len(step.args), tuple(step.kwargs))
    found = _BINDERS.get(key)
    if found is not None and found[0] is step.func:
        return found[1]
    source: dict[str, tuple[int, Any]] = {k: (_KW, k) for k in step.kwargs}
    for i, a in enumerate(step.func._schema.arguments[: len(step.args)]):
        source[a.name] = (_ARG, i)
    positional: list[tuple[int, Any]] = []
    pending: list[tuple[int, Any]] = []  # defaults that only matter if a later positional is given
    binder: _Binder | None = None
    for name, has_default, default in plan.positional:
        if name in source:
            positional.extend(pending)
            pending.clear()
            positional.append(source[name])
        elif has_default:
            pending.append((_DEFAULT, default))
        else:
            break
    else:
        keywords = tuple((k, *source[k]) for k in plan.keywords if k in source)
        binder = (tuple(positional), keywords)
    _BINDERS[key] = (step.func, binder)
    return binder


def _bind_out(plan: _OutPlan, step: OpStep) -> _Call | None:
    binder = _binder(plan, step)
    if binder is None:
        return None
    positional, keywords = binder
    sargs, skwargs = step.args, step.kwargs
    args = tuple(sargs[at] if kind == _ARG else skwargs[at] if kind == _KW else at for kind, at in positional)
    kwargs = {name: sargs[at] if kind == _ARG else skwargs[at] if kind == _KW else at for name, kind, at in keywords}
    if plan.list_out:
        kwargs[plan.outs[0]] = list(step.outputs)
    else:
        kwargs.update(zip(plan.outs, step.outputs))
    return (_fast_callable(plan.op, args, kwargs), args, kwargs)


# ---------------------------------------------------------------- compile


def _compute_then_copy(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], targets: tuple[tuple[int, torch.Tensor], ...]) -> Callable[[], None]:
    call = _fast_callable(func, args, kwargs)

    def run() -> None:
        flat = flat_outputs(call(*args, **kwargs))
        for i, static in targets:
            static.copy_(flat[i])

    return run


_RUNS = frozenset({"out", "rerun", "rerun+copy", "compute+copy"})


def _plan_kind(step: OpStep) -> str:
    """What replay does for one recorded op, as the trace note says it."""
    info = step.info
    if info.inplace_view:
        return "skip: inplace view"
    fresh = True in step.fresh
    if info.writes or not info.returns:  # mutations and pure effects (asserts)
        return "rerun+copy" if fresh else "rerun"
    if fresh:
        if info.alloc:
            return "skip: alloc"
        if False not in step.fresh:
            plan = _out_plan(step.func)
            if plan is not None and _binder(plan, step) is not None:
                return "out"
        return "compute+copy"
    outs = [t for t in step.outputs if isinstance(t, torch.Tensor)]
    if not outs:
        return "skip: no tensor output"
    return "skip: empty" if all(t.untyped_storage().nbytes() == 0 for t in outs) else "skip: view"


_CLONE = torch.ops.aten.clone.default
_INDEX = torch.ops.aten.index.Tensor
# recorded op -> its replay as cheaper calls leaving the same bytes (``_replay_ops``), or None where it does not apply
_MOVES = {torch.ops.aten.roll.default: roll_by_copies, torch.ops.aten.constant_pad_nd.default: pad_by_fill,
          torch.ops.aten.masked_fill.Scalar: masked_fill_by_copy}


def _boxed(op: Any) -> Any:
    return getattr(op, "_op", op)


def _plan_call(step: OpStep, kind: str) -> _Call:
    func = step.func
    if kind == "out":
        plan = _out_plan(func)
        assert plan is not None
        bound = _bind_out(plan, step)
        assert bound is not None
        if bound[0] is _boxed(plan.op):
            # no public binding takes this op's out=, and the boxed call costs more than the op at these sizes
            # (most such .out overloads compute and copy anyway): copy a clone's source straight in, compute
            # any other through its functional binding and copy the result in
            if func is _CLONE and isinstance(step.args[0], torch.Tensor):
                return (step.outputs[0].copy_, (step.args[0],), {})
            # pure data movement, done as cheaper calls that leave the same bytes (``_replay_ops``)
            moved = (rows_gather(step.args, step.kwargs, step.outputs[0], bound) if func is _INDEX else
                     _MOVES[func](step.args, step.kwargs, step.outputs[0]) if func in _MOVES else None)
            if moved is not None:
                return (moved, (), {})
            if _fast_callable(func, step.args, step.kwargs) is not _boxed(func):
                return (_compute_then_copy(func, step.args, step.kwargs, ((0, step.outputs[0]),)), (), {}) \
                    if len(step.outputs) == 1 else bound
        return bound
    if kind == "rerun":
        return (_fast_callable(func, step.args, step.kwargs), step.args, step.kwargs)
    targets = tuple((i, t) for i, (t, fresh) in enumerate(zip(step.outputs, step.fresh)) if fresh)
    return (_compute_then_copy(func, step.args, step.kwargs, targets), (), {})


def _drop_dead(steps: list[OpStep | IslandStep], kinds: list[str], private: set[StorageKey]) -> None:
    """Backward liveness over private storages: an op is dead when it only writes private memory nothing reads later."""
    live: set[StorageKey] = set()
    for i in range(len(steps) - 1, -1, -1):
        if kinds[i] not in _RUNS:
            continue
        step = steps[i]
        info = step.info  # type: ignore[union-attr]
        defined = [k for k, fresh in zip(step.out_keys, step.fresh) if fresh]  # type: ignore[union-attr]
        writes = defined + list(step.write_keys)  # type: ignore[union-attr]
        if not (info.seeded or not info.returns) and all(k in private and k not in live for k in writes):
            kinds[i] = "skip: dead"
            continue
        if not info.writes:  # a pure op defines its fresh outputs whole
            live.difference_update(defined)
        live.update(k for k in step.arg_keys if k in private)  # type: ignore[union-attr]


class _Buffer:
    __slots__ = ("storage", "nbytes", "device", "last", "owner")

    def __init__(self, storage: torch.UntypedStorage, last: int, owner: torch.Tensor) -> None:
        self.storage, self.nbytes, self.device, self.last, self.owner = storage, storage.nbytes(), storage.device, last, owner


_TIES = itertools.count()  # heap and sort tie-breakers, unique across the graphs of a pool


def _reuse_memory(rec: Recorder, steps: list[OpStep | IslandStep], kinds: list[str],
                  private: set[StorageKey], pool: TapePool) -> dict[int, list[torch.Tensor]]:
    """Give each private storage a buffer, reusing the memory of storages whose last reader has run.

    The pool's free buffers (of earlier graphs captured into it) are free from the start; at the end
    every buffer this graph used is free again for the pool's next capture.  Returns, per step index,
    the tensors that first owned the memory the step's outputs took over.  Storages no replayed op
    touches are emptied.
    """
    defined: dict[StorageKey, int] = {}
    last: dict[StorageKey, int] = {}
    for i, step in enumerate(steps):
        if isinstance(step, IslandStep):
            continue
        if True in step.fresh:
            for k, fresh in zip(step.out_keys, step.fresh):
                if fresh and k in private and k not in defined:
                    defined[k] = i
        if kinds[i] in _RUNS:
            for k in step.arg_keys:
                if k in private:
                    last[k] = i
            for k in step.out_keys:
                if k in private:
                    last[k] = i
    reused: dict[int, list[torch.Tensor]] = {}
    busy: list[tuple[int, int, _Buffer]] = []  # (last use, tie-breaker, buffer)
    free = pool.free
    for k, d in sorted(defined.items(), key=lambda kv: kv[1]):
        pins = rec.pins_by_key.get(k, [])
        if k not in last:  # nothing replayed touches it: hold no memory for it
            for p in pins:
                p.set_()
            continue
        while busy and busy[0][0] < d:
            _, m, done = heapq.heappop(busy)
            bisect.insort(free.setdefault(done.device, []), (done.nbytes, m, done))
        own = rec.fresh[k]
        assert own is not None
        storage = own.untyped_storage()
        candidates = free.get(storage.device)
        at = bisect.bisect_left(candidates, (storage.nbytes(),)) if candidates else 0
        if candidates and at < len(candidates):  # the smallest free buffer that fits
            buf = candidates.pop(at)[2]
            for p in pins:
                p.set_(buf.storage, p.storage_offset(), p.size(), p.stride())
            reused.setdefault(d, []).append(buf.owner)
            buf.last = last[k]
        else:
            buf = _Buffer(storage, last[k], own)
        heapq.heappush(busy, (buf.last, next(_TIES), buf))
    for _, m, done in busy:  # the graph's replay has ended: its memory is the pool's again
        bisect.insort(free.setdefault(done.device, []), (done.nbytes, m, done))
    return reused


_Segment = tuple[Callable[[], None], Callable[[], None] | None]
_FLAT_CODE: dict[str, Any] = {}

COMPILE_AFTER = 8
"""replays a graph runs its ops from a list before they are compiled into one generated function (``_flat``).

Compiling a segment's source costs about as much as tens of replays of the same ops from a list (``compile``
was a tenth of a library run's CPU time, most graphs being replayed a few times, many never), so a graph pays
for it only once it has shown it is replayed often; the two run the same calls on the same tensors."""


_LISTED = compile("""def run():
    line = 1
    try:
        for call, args, kwargs in OPS:
            line += 1
            call(*args, **kwargs)
    except BaseException as exc:
        exc.__traceback__ = AT_LINE(exc.__traceback__, line)
        raise
""", "<tape replay>", "exec")


def _at_line(tb: TracebackType | None, line: int) -> TracebackType | None:
    """``tb`` with its first entry (the listed replay's frame) at ``line``, the line ``_flat``'s source calls
    the op on: an error's frames (``check/run/frames.py``) are the same whichever form the replay ran."""
    if tb is None:
        return None
    return TracebackType(tb.tb_next, tb.tb_frame, -1, line)  # no instruction: the traceback reads tb_lineno


def _listed(ops: tuple[_Call, ...]) -> Callable[[], None]:
    """The ops of a segment called in turn from their list: what ``_flat`` compiles, without its compile (one
    loop compiled once, named and placed as ``_flat``'s function)."""
    scope: dict[str, Any] = {"OPS": ops, "AT_LINE": _at_line}
    exec(_LISTED, scope)  # noqa: S102 - a fixed loop over the calls bound at capture
    return scope.pop("run")  # not left in its own globals: a cycle only the cyclic collector frees


class _Plan:
    """A segment's replay plan: its recorded steps until the first replay binds their calls (``_plan_call``),
    which a graph never replayed does not pay for; replayed from the list of calls, compiled (``_flat``)
    at replay ``COMPILE_AFTER``."""

    __slots__ = ("steps", "island", "calls")

    def __init__(self, steps: list[tuple[OpStep, str]], island: Callable[[], None] | None) -> None:
        self.steps: list[tuple[OpStep, str]] | None = steps
        self.island = island
        self.calls: tuple[_Call, ...] = ()

    def listed(self) -> _Segment:
        if self.steps is not None:
            self.calls, self.steps = tuple(_plan_call(step, kind) for step, kind in self.steps), None
        return (_listed(self.calls), self.island)

    def flat(self) -> _Segment:
        self.listed()
        return (_flat(self.calls), self.island)


def _flat(ops: tuple[_Call, ...]) -> Callable[[], None]:
    """One generated function calling every op of a segment in turn, its arguments bound as globals.

    A straight line of calls costs the interpreter less than a loop unpacking ``(call, args, kwargs)``
    and spreading them; graphs of one shape (a runner's buckets) share the compiled code.
    """
    scope: dict[str, Any] = {}
    lines = ["def run():"]
    for i, (call, args, kwargs) in enumerate(ops):
        scope[f"f{i}"] = call
        parts = []
        for j, a in enumerate(args):
            scope[f"a{i}_{j}"] = a
            parts.append(f"a{i}_{j}")
        if kwargs:
            if all(k.isidentifier() and not keyword.iskeyword(k) for k in kwargs):
                for k, v in kwargs.items():
                    scope[f"k{i}_{k}"] = v
                    parts.append(f"{k}=k{i}_{k}")
            else:
                scope[f"k{i}"] = kwargs
                parts.append(f"**k{i}")
        lines.append(f"    f{i}({', '.join(parts)})")
    if not ops:
        lines.append("    pass")
    source = "\n".join(lines)
    code = _FLAT_CODE.get(source)
    if code is None:
        code = _FLAT_CODE[source] = compile(source, "<tape replay>", "exec")
    exec(code, scope)  # noqa: S102 - generated from positions and schema argument names
    return scope.pop("run")  # as ``_listed``: the tape dies with its graph, by reference counting



@dataclass(slots=True)
class _Compiled:
    segments: tuple[_Plan, ...]
    notes: tuple[str, ...]
    reused: dict[int, list[torch.Tensor]]
    homes: Homes


def _compile(rec: Recorder, pool: TapePool) -> _Compiled:
    steps = rec.steps
    # storages reallocated during capture stay where they are: steps on both sides of the op bind them
    private = set(rec.fresh) - rec.held_keys() - rec.relocated
    kinds = ["island" if isinstance(step, IslandStep) else _plan_kind(step) for step in steps]
    _drop_dead(steps, kinds, private)
    reused = _reuse_memory(rec, steps, kinds, private, pool)
    with torch.no_grad():
        for k, pin in rec.fresh.items():
            # a pin moved onto another storage's memory, or emptied, leaves the poisoning to that memory's owner
            if pin is not None and storage_key(pin) == k and pin.untyped_storage().nbytes():
                poison_storage(pin)
    segments: list[_Plan] = []
    ops: list[tuple[OpStep, str]] = []
    for step, kind in zip(steps, kinds):
        if isinstance(step, IslandStep):
            into = tuple(rec.pin_of(t) for t in step.statics)
            segments.append(_Plan(ops, island_runner(step, into)))
            ops = []
        elif kind in _RUNS:
            ops.append((step, kind))
    if ops or not segments:
        segments.append(_Plan(ops, None))
    watched = {k for k in (storage_key(t) for t in rec.inputs.values()) if k is not None}
    homes = Homes(rec.pins_by_key, skip=private | rec.old_block_keys, watched=watched, captured=rec.fresh)
    notes = tuple(f"{kind}: the old block into the reallocated one" if i in rec.block_copies
                  else f"{kind}, calls the op again" if i in rec.rerun_steps else kind for i, kind in enumerate(kinds))
    return _Compiled(tuple(segments), notes, reused, homes)


# ---------------------------------------------------------------- trace text


class _Namer:
    def __init__(self, serials: Mapping[int, int], names: Mapping[int, str]) -> None:
        self._serials = serials  # id(tensor) -> serial of the program tensor it stands for
        self._names = dict(names)  # serial -> name
        self._next_t = 0
        self._next_c = 0

    def name(self, t: torch.Tensor, *, produced: bool = False) -> str:
        serial = self._serials.get(id(t), -id(t))
        found = self._names.get(serial)
        if found is not None:
            return found
        if produced:
            self._next_t += 1
            name = f"t{self._next_t - 1}"
        else:
            self._next_c += 1
            name = f"c{self._next_c - 1}"
        self._names[serial] = name
        return name

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
    """A captured tape; ``replay()`` re-runs it on the captured memory."""

    def __init__(
        self,
        *,
        label: str,
        rec: Recorder,
        compiled: _Compiled,
        outputs: tuple[torch.Tensor, ...],
        pool: TapePool,
    ) -> None:
        self.label = label
        self.pool = pool
        self._plans = compiled.segments
        self._segments: tuple[_Segment, ...] | None = None  # bound at the first replay (``_Plan``)
        self._replays = 0
        self._notes = compiled.notes
        self._reused = compiled.reused
        self._homes = compiled.homes
        self._check_homes = compiled.homes.checks_every_replay
        self._steps = tuple(rec.steps)
        serials = dict(rec.serial_of_pin)
        for step in rec.steps:
            if isinstance(step, IslandStep):
                for t in (*step.args, *step.kwargs.values(), *step.statics):
                    if isinstance(t, torch.Tensor) and (serial := rec.serial_of(t)) is not None:
                        serials[id(t)] = serial
        self._serials = serials
        self._reads = tuple(rec.inputs.values())
        self._read_serials = tuple(rec.serial_of(t) for t in self._reads)
        self._audit_notes = tuple(rec.notes)
        self._rerun_ops = tuple(rec.rerun_ops)
        self._outputs = outputs
        self.stale: tuple[StaleInput, ...] = ()
        self.audit, self._watch, self._input_names = InputAudit(inputs=()), StaleWatch([], [], []), {}

    @property
    def outputs(self) -> tuple[torch.Tensor, ...]:
        """The static outputs ``fn`` returned at capture (the same objects forever); a region's are its program's."""
        return self._outputs

    @property
    def reads(self) -> tuple[torch.Tensor, ...]:
        """Every tensor the graph reads that capture did not allocate, in first-read order."""
        return self._reads

    def register(self, *, roots: Mapping[str, object], static_inputs: Iterable[torch.Tensor]) -> InputAudit:
        """Name what the graph reads from ``roots``, mark ``static_inputs`` registered, and watch them at replay."""
        self.audit, self._watch = build_audit(self._reads, roots, tuple(static_inputs), notes=self._audit_notes,
                                              rerun_ops=self._rerun_ops)
        self._input_names = {serial: entry.path or f"in{k}"
                             for k, (serial, entry) in enumerate(zip(self._read_serials, self.audit.inputs))}
        return self.audit

    def replay(self) -> tuple[StaleInput, ...]:
        if self._plans is None:
            raise RuntimeError(f"graph {self.label!r} was reset: capture it again before replaying it")
        if self._replays <= COMPILE_AFTER:
            if self._replays == 0:
                self._segments = tuple(plan.listed() for plan in self._plans)
            elif self._replays == COMPILE_AFTER:
                self._segments = tuple(plan.flat() for plan in self._plans)
            self._replays += 1
        stale = self._watch.check()
        if stale or self._check_homes:
            self._homes.before_replay(any(st.kind == "memory" for st in stale))
        for ops, island in self._segments:  # type: ignore[union-attr]
            with _below_autograd():
                ops()
            if island is not None:
                island()
        self.stale = stale
        return stale

    def reset(self) -> None:
        """Free the tape (``CUDAGraph.reset()``); its memory stays with its pool."""
        self._plans = None  # type: ignore[assignment]
        self._segments = None
        self._steps = ()
        self._notes = ()

    def trace(self) -> str:
        """One line per recorded step: the call, its outputs, and what replay does."""
        namer = _Namer(self._serials, self._input_names)
        lines = []
        for i, (step, note) in enumerate(zip(self._steps, self._notes)):
            if isinstance(step, IslandStep):
                head = f"island {getattr(step.fn, '__qualname__', repr(step.fn))}"
                text = namer.call(head, step.args, step.kwargs, step.statics)
            else:
                outs = step.outputs if step.info.returns else None
                text = namer.call(str(step.func), step.args, step.kwargs, outs)
            donors = self._reused.get(i)
            if donors:
                note = f"{note}, reuses {', '.join(namer.name(t) for t in donors)}"
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


class TapeCapture:
    """One open capture on the tape: the recorder under the program from ``begin`` to ``end``.

    ``end`` undoes what capture wrote and compiles the tape; both the callable form and a region
    (``region.RegionGraph``) capture through it.
    """

    def __init__(self, *, label: str, pool: object = None, capture_error_mode: str = "global",
                 islands: WarmIslands | None = None) -> None:
        if pool is not None and not isinstance(pool, TapePool):
            raise TypeError(f"pool must be a tape graph's pool() or a graph_pool_handle() of a tape run, got {pool!r}")
        self.label = label
        self.pool: TapePool = pool if pool is not None else TapePool()
        self._rec = Recorder(undo=True, record=True, capturing=True, capture_error_mode=capture_error_mode,
                             island_impl=_tape_island if islands is not None else None)
        self._scope = ExitStack()

    def begin(self) -> None:
        self._scope.enter_context(no_cycle_collection())
        try:
            self._scope.enter_context(self._rec.active())
        except BaseException:
            self._scope.close()
            raise

    def end(self, outputs: tuple[torch.Tensor, ...] = (), *, roots: Mapping[str, object] | None = None,
            static_inputs: Iterable[torch.Tensor] = ()) -> TapeGraph:
        rec = self._rec
        try:
            self._scope.close()  # leaves the recorder; a capture another thread invalidated fails here
        finally:
            rec.restore()
        with no_cycle_collection():
            compiled = _compile(rec, self.pool)
            self.pool.graphs += 1
            graph = TapeGraph(label=self.label, rec=rec, compiled=compiled, outputs=outputs, pool=self.pool)
            graph.register(roots=roots or {}, static_inputs=static_inputs)
        return graph

    def abort(self) -> None:
        try:
            self._scope.close()
        except CaptureError:  # an invalidated capture: the error that ended it matters
            pass
        finally:
            self._rec.restore()


class TapeEngine:
    name = "tape"

    def run(self, *, device: TapeDevice = TapeDevice()) -> AbstractContextManager[GraphRun]:
        """Serve ``torch.cuda``'s graph API, streams and device queries from the tape on this thread (``region.py``)."""
        return open_run(self, NAMES, TapeDeviceState(device))

    def open_region(self, *, label: str, pool: object = None, capture_error_mode: str = "global") -> TapeCapture:
        """A capture a program opens itself (``torch.cuda.CUDAGraph.capture_begin``), on the run's capture stream."""
        refuse_default_stream()
        return TapeCapture(label=label, pool=pool, capture_error_mode=capture_error_mode)

    @no_cycle_collection()
    def capture(
        self,
        fn: Callable[[], object],
        *,
        label: str,
        roots: Mapping[str, object],
        static_inputs: Iterable[torch.Tensor],
        islands: bool = False,
        capture_error_mode: str = "global",
    ) -> TapeGraph:
        static = tuple(static_inputs)
        check_capture_error_mode(capture_error_mode)
        warm = WarmIslands() if islands else None
        warm_up(fn, warm)
        region = TapeCapture(label=label, capture_error_mode=capture_error_mode, islands=warm)
        region.begin()
        try:
            outputs = static_outputs(fn())
        except BaseException:
            region.abort()
            raise
        return region.end(outputs, roots=roots, static_inputs=static)
