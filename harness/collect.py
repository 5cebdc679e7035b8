"""Scenario files as pytest items, shaped like pytest's "non-python tests" example.

``scenarios/swa_prefill_window_edge.toml`` yields ``swa_prefill_window_edge[stale_state-piecewise-torch_native]``
and its siblings, one per (design, mode, backend), plus one item per backend that certifies the
scenario's reference run against the dense oracle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from .check.matrix import Case, CaseResult, cases, run_case, scenario_reference
from .check.oracle import certify, dense_oracle
from .scenario import ScenarioError, ScenarioSpec, load_scenario
from .serving.model import SyntheticModel


class ScenarioMismatch(Exception):
    """The observed verdict is not the one the scenario file expects."""

    def __init__(self, result: CaseResult) -> None:
        super().__init__(result.case.name)
        self.result = result


class ReferenceNotCertified(Exception):
    pass


def describe_result(result: CaseResult) -> str:
    """The failure block: expected vs observed, where it first diverged, and how to reproduce."""
    case, verdict = result.case, result.verdict
    unexpected_pass = verdict.outcome == "match" and case.expected != "match"
    head = f"{case.name}: expected {case.expected}, observed {verdict.outcome}"
    if unexpected_pass:
        head = (f"UNEXPECTED PASS {head}. The known bug no longer reproduces: if a fix landed, update the "
                f"expectation and its why in the scenario file")
    lines = [head, f"  why expected: {case.why}"]
    if case.faults:
        lines.append(f"  faults: {', '.join(sorted(case.faults))}")
    lines.append(f"  observed: {verdict.summary()}")
    diff = verdict.diff
    if diff is not None and diff.total:
        classes = ", ".join(f"{name} {n}" for name, n in diff.classes)
        lines.append(f"  {diff.total} mismatches over {diff.mismatched_slots} slots ({classes}); "
                     f"dummy-slot writes: {diff.dummy_writes}")
        for m in diff.mismatches[1:4]:
            lines.append(f"    also: {m.where()}: {m.classification} ({m.detail})")
    lines.extend(f"  graph: {note}" for note in verdict.notes)
    lines.append(f"  reproduce: {case.reproduce()}")
    return "\n".join(lines)


class ScenarioFile(pytest.File):
    def collect(self) -> Iterator[pytest.Item]:
        try:
            scenario = load_scenario(self.path)
        except ScenarioError as err:
            yield BadScenarioItem.from_parent(self, name=f"{self.path.stem}[load]", error=err)
            return
        options = self.config.option
        device = getattr(options, "harness_device", "cpu") or "cpu"
        engine = getattr(options, "harness_engine", None) or ("cuda" if device == "cuda" else "tape")
        for backend in scenario.backends:
            yield OracleItem.from_parent(
                self, name=f"{scenario.name}[oracle-{backend}]", scenario=scenario, backend=backend, device=device
            )
        for case in cases(scenario, engine=engine, device=device):
            item = ScenarioItem.from_parent(self, name=case.name, case=case)
            # tags select with -k, like names do; they are not markers, so no registration is needed
            item.extra_keyword_matches.update(scenario.tags)
            if device == "cuda" or engine == "cuda":
                item.add_marker("gpu")
            yield item


class ScenarioItem(pytest.Item):
    def __init__(self, *, case: Case, **kwargs) -> None:
        super().__init__(**kwargs)
        self.case = case

    def runtest(self) -> None:
        result = run_case(self.case)
        verdict = result.verdict
        self.user_properties.append(("expected", self.case.expected))
        self.user_properties.append(("verdict", verdict.outcome))
        if not result.ok:
            raise ScenarioMismatch(result)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ScenarioMismatch):
            return describe_result(excinfo.value.result)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, self.name


class OracleItem(pytest.Item):
    """The scenario's reference run agrees with the float64 dense oracle on every live slot and hidden state."""

    def __init__(self, *, scenario: ScenarioSpec, backend: str, device: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.scenario = scenario
        self.backend = backend
        self.device = device

    def runtest(self) -> None:
        reference = scenario_reference(self.scenario, backend=self.backend, device=self.device)
        spec = reference.spec
        if reference.error is not None:
            raise ReferenceNotCertified(f"reference run failed at step {reference.error.step}: "
                                        f"{reference.error.type}: {reference.error.message}")
        model = SyntheticModel(spec.model, spec.device)
        cert = certify(reference.snapshots, dense_oracle(model, spec.timeline), model=model,
                       kv_dtype=spec.pool.kv_dtype, kv_scales=model.kv_scales())
        if not cert.ok:
            raise ReferenceNotCertified("reference run disagrees with the dense oracle:\n  " + "\n  ".join(cert.problems))

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ReferenceNotCertified):
            return f"{self.name}: {excinfo.value}"
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, self.name


class BadScenarioItem(pytest.Item):
    """A scenario file that does not load fails as one item; the other files still run."""

    def __init__(self, *, error: ScenarioError, **kwargs) -> None:
        super().__init__(**kwargs)
        self.error = error

    def runtest(self) -> None:
        raise self.error

    def repr_failure(self, excinfo, style=None):
        return str(self.error)

    def reportinfo(self):
        return self.path, None, self.name


def is_scenario_file(path: Path, rootpath: Path) -> bool:
    """A ``.toml`` file below a folder named ``scenarios`` inside the project (not above it)."""
    if path.suffix != ".toml":
        return False
    try:
        parts = path.relative_to(rootpath).parts
    except ValueError:
        parts = path.parts
    return "scenarios" in parts[:-1]
