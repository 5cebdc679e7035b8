"""View models of a run's results: plain data, no tensors, built once and rendered many ways.

The terminal failure block, the run table, the verdict matrix, the JSON records and CSV (and the HTML
pages) are renderers of these. A ``CaseView`` round-trips through its JSON record, which is how results
cross from pytest-xdist workers to the controller without loss. Fields added after version 1 of the
record (``setup``, ``steps``, ``heat``, a mismatch's ``holder``, ``found_in`` and ``written_at``, an error's ``frames``, a
forward's ``graph``, the setup's ``groups``) have defaults, so a results file written before them still reads; ``clean_rerun``,
which such a file only shows in the run's name, is derived from that name at reading, in
``CaseView.from_record`` only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..fields import field_names

INFORMATION = "information"
"""``check.matrix.expect.INFORMATION`` (not imported: the views need nothing of the checking): the expectation of
an added design's run under a fault scenario's faults by default; whatever it gives is as expected"""

_ATOMS = frozenset({str, int, float, bool, type(None)})


def plain(obj: Any) -> Any:
    """``dataclasses.asdict`` of a view, field for field: a results file holds millions of values, and
    ``asdict`` asks ``fields()`` of every object and deep-copies every string and number (immutable, so
    handed on here as they are), which made it most of the time a report took to write."""
    cls = type(obj)
    if cls in _ATOMS:
        return obj
    names = field_names(cls)
    # atoms are handed on without a call: they are most of the values
    if names is not None:
        return {name: v if type(v := getattr(obj, name)) in _ATOMS else plain(v) for name in names}
    if cls is list or cls is tuple:
        return cls([v if type(v) in _ATOMS else plain(v) for v in obj])
    if cls is dict:
        return {plain(k): v if type(v) in _ATOMS else plain(v) for k, v in obj.items()}
    return dataclasses.asdict(_Boxed(obj))["value"]  # anything else exactly as asdict would give it


@dataclass(frozen=True, slots=True)
class _Boxed:
    value: Any


RECORD_VERSION = 1
"""schema version of a JSON record; bumped when a field changes meaning or goes away"""


@dataclass(frozen=True, slots=True, kw_only=True)
class MismatchView:
    step: int
    pool: str
    """the KV group ("full", "swa" in SGLang's layout) or "hidden\""""
    layer: int | None
    slot: int | None
    owner: str
    """``rid@pos`` of the token that owns the slot"""
    what: str
    classification: str
    detail: str
    holder: str | None = None
    """``rid@pos`` whose K/V an ``overwritten`` slot holds, when the diff could name it"""
    found_in: int | None = None
    """for ``misplaced``: the slot of the same layer that holds the expected row"""
    written_at: int | None = None
    """the step that last wrote the slot in the subject's run (its pool's write log); None: nothing wrote it
    since it was poisoned, a hidden state, or a record written before the field"""


@dataclass(frozen=True, slots=True, kw_only=True)
class FrameView:
    file: str
    """relative to the working directory when inside it"""
    line: int
    function: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorView:
    type: str
    message: str
    step: int | None
    frames: tuple[FrameView, ...] = ()
    """where it was raised in the design's, backend's or runner's code, outermost first, the innermost frame
    always kept (records written before frames were kept have none)"""


@dataclass(frozen=True, slots=True, kw_only=True)
class FindingView:
    kind: str
    """one of "unregistered", "stale", "moved"."""
    graph: str
    path: str | None
    dtype: str
    shape: tuple[int, ...]
    replays: int
    captured: str
    now: str


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphView:
    captures: int
    replays: int
    padded_replays: int
    eager_fallbacks: int
    findings: tuple[FindingView, ...]
    rerun_ops: tuple[str, ...] = ()
    """custom ops the engine replays by calling them again (their work is invisible to the dispatcher)"""
    notes: tuple[str, ...] = ()
    """what the engine could not model and says so (a capture-query guard that cannot see the capture)"""
    forwards: tuple[tuple[str, int], ...] = ()
    """(graph name, forwards that used it): ``decode/bs4``, ``eager`` for the forwards no graph took"""


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupView:
    """One KV group of the stack under test (``serving.kv_groups.KVGroup``), as the report draws it."""

    name: str
    label: str
    """how prose names it ("SWA")"""
    size: int
    """slots of its pool, the dummy page included"""
    window: int | None
    """None for a full-attention group"""
    layers: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class SetupView:
    """What a scenario's run is made of, for the report's settings and pictures."""

    model: str
    """the model preset's name"""
    layers: tuple[str, ...]
    """per layer: the name of the KV group holding its K/V ("swa" or "full" in SGLang's layout)"""
    window: int
    full_size: int
    """slots in the full pool, the dummy slot 0 included"""
    swa_size: int
    kv_dtype: str
    model_seed: int
    timeline_seed: int
    decode_buckets: tuple[int, ...]
    prefill_buckets: tuple[int, ...]
    chunk_size: int | None
    draft_steps: int
    page_size: int = 1
    """token slots per page (records written before pages existed: 1)"""
    eviction: str = "tight"
    """the SWA eviction policy's name"""
    serving: str = "miniature"
    """the serving stack under test"""
    groups: tuple[GroupView, ...] = ()
    """the stack's KV groups, in its order; empty for SGLang's two (``full`` of ``full_size`` slots, then ``swa``
    of ``swa_size`` with ``window``), which the fields above describe (left out of the JSON record when empty)"""


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardView:
    path: str
    """"eager", "fallback" (no bucket fits) or "replay\""""
    rows: int
    bucket: int | None
    captured: bool
    """replayed right after an on-demand capture"""
    graph: str | None = None
    """the graph the forward used (``decode/bs4``, ``eager``), as the input audit's findings name a replayed one"""


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenSlotsView:
    rid: str
    pos: int
    slots: tuple[int, ...]
    """the token's slot in each KV group, in the stack's order (SGLang's: full, then SWA); 0 in a windowed
    group once evicted (the dummy slot)"""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepView:
    index: int
    kind: str
    """"extend", "decode" or "draft\""""
    batch_size: int
    tokens: tuple[tuple[str, int], ...]
    """(rid, tokens written this step), batch order"""
    forwards: tuple[ForwardView, ...]
    written: tuple[TokenSlotsView, ...]
    """the slots of the tokens the step wrote; ``[rid, pos, slot in each group...]`` in the JSON record
    (``[rid, pos, full_slot, swa_slot]`` for SGLang's two groups)"""
    evicted: tuple[tuple[str, int], ...]
    """(rid, pos) of tokens whose windowed groups' (SWA) slots were freed after the step"""
    finished: tuple[str, ...]
    aborted: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class HeatView:
    step: int
    pool: str
    layer: int | None
    count: int
    """mismatched slots (hidden rows) in this (step, pool, layer), over the whole run"""


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseView:
    name: str
    """the pytest item name, ``scenario[design-mode-backend]``"""
    scenario: str
    path: str
    description: str
    tags: tuple[str, ...]
    design: str
    mode: str
    backend: str
    engine: str
    device: str
    faults: tuple[str, ...]
    clean_rerun: bool
    """the fault-free rerun of a fault scenario's run (the ``-nofault`` item): ``faults`` is then empty"""
    expected: str
    verdict: str
    """an outcome, or "skipped" when the backend cannot run the case"""
    why: str
    skip_reason: str | None
    mismatches: int
    mismatched_slots: int
    classes: tuple[tuple[str, int], ...]
    dummy_writes: int
    steps_compared: int
    first: MismatchView | None
    details: tuple[MismatchView, ...]
    """the first mismatches in step order (the first one included), as many as the diff kept"""
    error: ErrorView | None
    graph: GraphView | None
    reproduce_pytest: str
    """a shell command line, quoted"""
    reproduce_cli: str
    duration_s: float = 0.0
    """seconds the run took (not in results.json records, which stay deterministic)"""
    setup: SetupView | None = None
    steps: tuple[StepView, ...] = ()
    """the run's timeline; empty for skipped cases"""
    heat: tuple[HeatView, ...] = ()
    """mismatch counts per (step, pool, layer) over the whole run (``details`` stops at the diff's limit)"""
    references: tuple[str, ...] = ()
    """the scenario's real-bug references (``ScenarioSpec.references``)"""
    judged_by: str | None = None
    """which reference run judged it, where a plug-in (a backend, serving stack or eviction policy named by import
    path) is involved (``Case.judged_by``); None, and not in the record, where everything is the library's own"""
    schedule_note: str | None = None
    """where the subject first kept the same live tokens as its reference in other slots (``DiffResult.schedule_note``):
    compared token by token, a note and never a mismatch; None, and not in the record, where the schedules agree"""
    added_design: bool = False
    """a design the scenario does not list, added by ``--design``: its expectations are borrowed (``like:DESIGN``,
    a stated verdict or ``information``), never the scenario file's"""

    @property
    def ok(self) -> bool:
        return self.skip_reason is not None or self.verdict == self.expected or self.information

    @property
    def information(self) -> bool:
        """No verdict was known (an added design under a fault scenario's faults): the verdict says whether the
        fault reaches the design, and is never unexpected."""
        return self.expected == INFORMATION

    @property
    def unexpected_pass(self) -> bool:
        return self.verdict == "match" and self.expected != "match" and not self.information

    def to_record(self, *, timing: bool = False) -> dict[str, Any]:
        """The JSON record (documented in docs/reference.md, "results.json").

        Records are deterministic: the same inputs give equal records. ``timing`` adds the run's duration,
        for carrying a view between processes (pytest-xdist), never for results files.
        """
        record = plain(self)
        if not timing:
            del record["duration_s"]
        record["version"] = RECORD_VERSION
        record["ok"] = self.ok
        record["first_divergent_step"] = self.first.step if self.first else None
        for step in record["steps"]:
            # every token of a run appears once here: [rid, pos, full_slot, swa_slot] keeps results.json small
            step["written"] = [[t["rid"], t["pos"], *t["slots"]] for t in step["written"]]
        if record["setup"] is not None and not record["setup"]["groups"]:
            del record["setup"]["groups"]
        if not record["added_design"]:  # the records of the library's own runs keep their shape
            del record["added_design"]
        if record["judged_by"] is None:
            del record["judged_by"]
        if record["schedule_note"] is None:  # every library run's schedule is its reference's
            del record["schedule_note"]
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> CaseView:
        if "clean_rerun" not in record:
            # written before the field: only the item name (``Case.name``'s ``-nofault`` suffix) tells
            record = {**record, "clean_rerun": record["name"].endswith("-nofault]")}
        data = {f.name: record[f.name] for f in dataclasses.fields(cls)
                if f.name in record or f.default is dataclasses.MISSING}
        data["tags"] = tuple(data["tags"])
        data["references"] = tuple(data.get("references", ()))
        data["faults"] = tuple(data["faults"])
        data["classes"] = tuple((str(k), int(n)) for k, n in data["classes"])
        data["first"] = _mismatch(data["first"])
        data["details"] = tuple(_mismatch(m) for m in data["details"])
        data["error"] = _error(data["error"]) if data["error"] else None
        if data["graph"]:
            g = dict(data["graph"])
            g["findings"] = tuple(FindingView(**{**f, "shape": tuple(f["shape"])}) for f in g["findings"])
            for name in ("rerun_ops", "notes"):
                g[name] = tuple(g.get(name, ()))
            g["forwards"] = tuple((str(name), int(n)) for name, n in g.get("forwards", ()))
            data["graph"] = GraphView(**g)
        if data.get("setup"):
            setup = dict(data["setup"])
            for key in ("layers", "decode_buckets", "prefill_buckets"):
                setup[key] = tuple(setup[key])
            setup["groups"] = tuple(GroupView(**{**g, "layers": tuple(g["layers"])}) for g in setup.get("groups") or ())
            data["setup"] = SetupView(**setup)
        data["steps"] = tuple(_step(s) for s in data.get("steps") or ())
        data["heat"] = tuple(HeatView(**h) for h in data.get("heat") or ())
        return cls(**data)


def _step(record: dict[str, Any]) -> StepView:
    return StepView(
        index=record["index"], kind=record["kind"], batch_size=record["batch_size"],
        tokens=tuple((str(rid), int(n)) for rid, n in record["tokens"]),
        forwards=tuple(ForwardView(**f) for f in record["forwards"]),
        written=tuple(TokenSlotsView(rid=str(rid), pos=int(pos), slots=tuple(int(s) for s in slots))
                      for rid, pos, *slots in record["written"]),
        evicted=tuple((str(rid), int(pos)) for rid, pos in record["evicted"]),
        finished=tuple(record["finished"]), aborted=tuple(record["aborted"]),
    )


def _error(record: dict[str, Any]) -> ErrorView:
    frames = tuple(FrameView(**f) for f in record.get("frames") or ())
    return ErrorView(**{**record, "frames": frames})


def _mismatch(record: dict[str, Any] | None) -> MismatchView | None:
    return MismatchView(**record) if record else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Tally:
    """How a set of runs went against their expectations."""

    as_expected: int
    unexpected: int
    skipped: int


def fault_split(views: Sequence[CaseView]) -> dict[str, Tally]:
    """The runs apart by whether the library injected a fault into them: ``clean`` (scenarios without faults,
    and fault scenarios rerun with the faults off) and ``injected_faults``. A design's own bug shows in
    ``clean``; under an injected fault every design may diverge, as the scenario's expectations say."""
    out = {}
    for key, part in (("clean", [v for v in views if not v.faults]), ("injected_faults", [v for v in views if v.faults])):
        skipped = sum(v.skip_reason is not None for v in part)
        unexpected = sum(not v.ok for v in part)
        out[key] = Tally(as_expected=len(part) - skipped - unexpected, unexpected=unexpected, skipped=skipped)
    return out
