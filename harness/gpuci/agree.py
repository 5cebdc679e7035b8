"""``python -m harness.gpuci.agree CUDA.json TAPE.json``: the tape emulator against real CUDA graphs, verdict by verdict.

The tape engine stands in for CUDA graphs on every CPU machine, so on a GPU the same runs under both engines
must give the same verdict: a run the tape calls ``match`` that real graphs make ``diverge`` is a graph
semantic the emulator gets wrong, and every CPU verdict of that kind is suspect. Runs pair by name (the
engine is not part of it); a run only one side holds is a disagreement too, so a shard or a crash that loses
runs cannot pass for agreement. Exit 0 when every verdict agrees, 1 listing each disagreement, 2 when a file
is not a complete results file of one engine.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..report.results_schema import ResultsFileError, read_document
from ..report.text import printable

__all__ = ["Agreement", "Disagreement", "compare_engines", "main"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Disagreement:
    name: str
    """the run, ``scenario[design-mode-backend]``"""
    first: str | None
    """its verdict in the first file; None: the file lacks the run"""
    second: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Agreement:
    engines: tuple[str, str]
    """each file's engine"""
    agreed: int
    """runs both files hold with one verdict"""
    disagreements: tuple[Disagreement, ...]

    @property
    def ok(self) -> bool:
        """Every run in both files, with one verdict."""
        return not self.disagreements

    def lines(self) -> list[str]:
        """What the check prints: a line per disagreement, then the count."""
        a, b = self.engines
        out = []
        for d in self.disagreements:
            out.append(f"  {printable(d.name)}: {a} {d.first or 'missing'}, {b} {d.second or 'missing'}")
        if self.ok:
            out.append(f"engines {a} and {b} agree on all {self.agreed} verdicts")
        else:
            out.insert(0, f"engines {a} and {b} disagree on {len(self.disagreements)} of "
                          f"{self.agreed + len(self.disagreements)} runs:")
        return out


def _verdicts(path: Path) -> tuple[str, dict[str, str]]:
    """The file's engine and its verdict by run name; ``ResultsFileError`` when it is not one engine's
    complete results."""
    doc = read_document(path)
    if not doc.get("complete", False):
        raise ResultsFileError(f"{path}: the run stopped early (complete is false): its verdicts are not the whole run")
    engines = {r["engine"] for r in doc["records"]}
    if len(engines) != 1:
        found = ", ".join(sorted(engines)) or "no record"
        raise ResultsFileError(f"{path}: expected the runs of one graph engine, found {found}")
    return engines.pop(), {r["name"]: r["verdict"] for r in doc["records"]}


def compare_engines(first: Path, second: Path) -> Agreement:
    """Pair the runs of two results files by name and compare their verdicts."""
    (engine_a, a), (engine_b, b) = _verdicts(first), _verdicts(second)
    if engine_a == engine_b:
        raise ResultsFileError(f"{first} and {second} are both runs of the {engine_a} engine: compare the cuda "
                               "run with the tape run")
    out = [Disagreement(name=n, first=a.get(n), second=b.get(n)) for n in sorted(a.keys() | b.keys())
           if a.get(n) != b.get(n)]
    return Agreement(engines=(engine_a, engine_b), agreed=len(a.keys() & b.keys()) - sum(
        1 for d in out if d.first is not None and d.second is not None), disagreements=tuple(out))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.gpuci.agree",
                                     description="exit 1 unless two engines' results files give every run one verdict")
    parser.add_argument("first", type=Path, metavar="CUDA.json")
    parser.add_argument("second", type=Path, metavar="TAPE.json")
    args = parser.parse_args(argv)
    try:
        agreement = compare_engines(args.first, args.second)
    except ResultsFileError as exc:
        print(printable(str(exc)), file=sys.stderr)
        return 2
    for line in agreement.lines():
        print(line)
    return 0 if agreement.ok else 1


if __name__ == "__main__":
    sys.exit(main())
