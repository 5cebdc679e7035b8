"""What one fuzz campaign checks: a design, a mode, a backend and a set of faults (``FuzzTarget``).

The property is the same for every target: the subject run matches the eager reference at every step
(every live KV slot of every group, every hidden state) and the pool invariants hold after every step. A
target's ``problems()`` refuses the combinations that could never say anything (a fault that cannot act in
the mode, or that the backend has no switch for), in the words the command line shows.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from ..imports import is_import_path
from ..runspec import Mode
from ..serving.designs import DESIGNS
from ..serving.faults import FAULTS


@dataclass(frozen=True, slots=True, kw_only=True)
class FuzzTarget:
    design: str
    mode: Mode
    backend: str = "torch_native"
    faults: frozenset[str] = frozenset()

    @property
    def label(self) -> str:
        faults = f" with {', '.join(sorted(self.faults))}" if self.faults else ""
        return f"{self.design}/{self.mode} on {self.backend}{faults}"

    @property
    def needs_drafts(self) -> bool:
        return any(FAULTS[f].needs_drafts for f in self.faults if f in FAULTS)

    @property
    def needs_prefix_cache(self) -> bool:
        return any(FAULTS[f].needs_prefix_cache for f in self.faults if f in FAULTS)

    @classmethod
    def parse(cls, text: str) -> FuzzTarget:
        """``design:mode[:fault...]`` (as ``make fuzz`` and a campaign spell a target); ValueError naming what is
        wrong."""
        design, _, rest = text.partition(":")
        mode, *faults = rest.split(":")
        if mode not in tuple(Mode):
            raise ValueError(f"{text!r}: expected design:mode[:fault...], the mode one of {', '.join(Mode)}")
        target = cls(design=design, mode=Mode(mode), faults=frozenset(f for f in faults if f))
        if problems := target.problems():
            raise ValueError(f"{text!r}: {'; '.join(problems)}")
        return target

    def command(self, *, seed: int, budget_s: float | None = None) -> str:
        """The command line that runs this campaign again."""
        words = ["python", "-m", "harness", "fuzz", "--design", self.design, "--mode", str(self.mode)]
        if self.backend != "torch_native":
            words += ["--backend", self.backend]
        for fault in sorted(self.faults):
            words += ["--fault", fault]
        if budget_s is not None:
            words += ["--budget", f"{budget_s:g}"]
        words += ["--seed", str(seed)]
        return shlex.join(words)

    def problems(self) -> list[str]:
        """Every reason this target cannot be fuzzed, one line each."""
        from ..backends.registry import BACKENDS, backend_class

        out = []
        if self.design not in DESIGNS and not is_import_path(self.design):
            out.append(f"--design: unknown design {self.design!r}; known: {', '.join(DESIGNS)}")
        if self.backend not in BACKENDS and not is_import_path(self.backend):
            out.append(f"--backend: unknown backend {self.backend!r}; known: {', '.join(BACKENDS)}")
            return out
        for fault in sorted(self.faults):
            known = FAULTS.get(fault)
            if known is None:
                out.append(f"--fault: unknown fault {fault!r}; known: {', '.join(FAULTS)}")
            elif self.mode not in known.modes:
                out.append(f"--fault: {fault} acts only in {' or '.join(known.modes)} mode, not {self.mode}")
        if not out:  # what the backend declares it cannot run, on this machine's device
            out.extend(f"--backend: {why}" for why in
                       backend_class(self.backend).unsupported(mode=self.mode, device="cpu", faults=self.faults))
        return out


__all__ = ["FuzzTarget"]
