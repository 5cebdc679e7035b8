"""A finding as a permanent regression: a scenario file under ``scenarios/regressions/`` that pytest collects
like every other, expecting the verdicts the fuzzer observed.

The file runs the finding's one design, mode and backend; its expectation is the verdict observed, and with
faults also the verdict of the same run without them (so the file shows the fault is what breaks it); its
``why`` quotes the first divergence and the command that found it. The file name ends in the finding's key
(target and signature), so a second finding of the same signature is not written again.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from .finding import Finding

REGRESSIONS_DEFAULT = Path("scenarios/regressions")


def regression_path(finding: Finding, folder: Path) -> Path:
    t = finding.target
    slug = re.sub(r"[^\w]+", "_", t.design).strip("_")
    return folder / f"fuzz_{slug}_{t.mode}_{finding.key}.toml"


def write_regression(finding: Finding, *, folder: Path = REGRESSIONS_DEFAULT, command: str) -> Path | None:
    """Write ``finding`` as a scenario file in ``folder``; None when a file of its signature is there already."""
    from ..check.matrix.judgement import Judgement, judge_one
    from ..runspec import Outcome
    from ..scenario.generated import scenario_of
    from ..scenario.spec import Expectation
    from ..scenario.writer import scenario_toml

    path = regression_path(finding, folder)
    if path.exists():
        return None
    spec, verdict = finding.spec, finding.verdict
    clean = None
    if spec.faults:
        twin = dataclasses.replace(spec, faults=frozenset())
        clean = judge_one(twin, Judgement(expected=Outcome.MATCH, why="the clean twin")).verdict.outcome
    why = f"first divergence: {verdict.summary()}; found by `{command}`"
    if clean is not None:
        why += f"; without {', '.join(sorted(spec.faults))}: {clean}"
    scenario = scenario_of(
        spec, name=path.stem,
        description=(f"Found by the fuzzer and shrunk by Hypothesis: {finding.target.label} gives "
                     f"{finding.signature}. Found by: {command}"),
        expectations=[Expectation(design=spec.design, verdict=verdict.outcome, without_faults=clean, why=why)],
        tags=("generated", "fuzz"),
    )
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(scenario_toml(scenario))
    return path


def replay_regression(path: Path) -> list[str]:
    """Every run of the scenario file at ``path`` judged against its expectations, as pytest collects it: the
    ones that did not give their expected verdict, a line each (none: the file reproduces what it records)."""
    from ..check.matrix.judgement import Judgement, judge_one
    from ..scenario.loader import load_scenario

    scenario = load_scenario(path)
    out = []
    for design in scenario.designs:
        exp = scenario.expectation(design)
        for mode in scenario.modes:
            for backend in scenario.backends:
                for with_faults in (True, False) if scenario.faults else (True,):
                    expected = exp.expected(mode=mode, backend=backend, with_faults=with_faults)
                    if expected is None:
                        continue
                    spec = scenario.run_spec(design=design, mode=mode, backend=backend, with_faults=with_faults)
                    judged = judge_one(spec, Judgement(expected=expected, why=exp.why))
                    if not judged.held:
                        out.append(judged.summary())
    return out


__all__ = ["REGRESSIONS_DEFAULT", "regression_path", "replay_regression", "write_regression"]
