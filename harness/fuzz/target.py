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
from ..serving.faults import FAULTS, Component

MINIATURE = "miniature"


@dataclass(frozen=True, slots=True, kw_only=True)
class FuzzTarget:
    design: str
    mode: Mode
    backend: str = "torch_native"
    faults: frozenset[str] = frozenset()
    serving: str = MINIATURE
    """the serving stack every run is moved onto (``fuzz.properties.FUZZ_STACKS``); the harness's own by default"""

    @property
    def label(self) -> str:
        faults = f" with {', '.join(sorted(self.faults))}" if self.faults else ""
        serving = f" over {self.serving}" if self.serving != MINIATURE else ""
        return f"{self.design}/{self.mode} on {self.backend}{serving}{faults}"

    def _needs(self, what: str) -> bool:
        """Whether a fault of the target acts only where a run has ``what`` (a ``Fault.needs_*`` flag)."""
        return any(getattr(FAULTS[f], f"needs_{what}") for f in self.faults if f in FAULTS)

    needs_drafts = property(lambda self: self._needs("drafts"))
    needs_prefix_cache = property(lambda self: self._needs("prefix_cache"))
    needs_verify = property(lambda self: self._needs("verify"))
    needs_fused_write = property(lambda self: self._needs("fused_write"))
    needs_tree = property(lambda self: self._needs("tree"))
    needs_draft_extend = property(lambda self: self._needs("draft_extend"))

    @classmethod
    def parse(cls, text: str) -> FuzzTarget:
        """``design:mode[:fault...][@stack]`` (as ``make fuzz`` and a campaign spell a target); ValueError naming
        what is wrong."""
        body, at, serving = text.partition("@")
        design, _, rest = body.partition(":")
        mode, *faults = rest.split(":")
        if mode not in tuple(Mode) or (at and not serving):
            raise ValueError(f"{text!r}: expected design:mode[:fault...][@stack], the mode one of {', '.join(Mode)}")
        target = cls(design=design, mode=Mode(mode), faults=frozenset(f for f in faults if f),
                     serving=serving or MINIATURE)
        if problems := target.problems():
            raise ValueError(f"{text!r}: {'; '.join(problems)}")
        return target

    def command(self, *, seed: int, budget_s: float | None = None) -> str:
        """The command line that runs this campaign again."""
        words = ["python", "-m", "harness", "fuzz", "--design", self.design, "--mode", str(self.mode)]
        if self.backend != "torch_native":
            words += ["--backend", self.backend]
        if self.serving != MINIATURE:
            words += ["--serving", self.serving]
        for fault in sorted(self.faults):
            words += ["--fault", fault]
        if budget_s is not None:
            words += ["--budget", f"{budget_s:g}"]
        words += ["--seed", str(seed)]
        return shlex.join(words)

    def problems(self) -> list[str]:
        """Every reason this target cannot be fuzzed, one line each."""
        from ..backends.registry import BACKENDS, backend_class

        from .properties import FUZZ_STACKS

        out = []
        if self.serving != MINIATURE and self.serving not in FUZZ_STACKS:
            out.append(f"--serving: no fuzzable serving stack {self.serving!r}; known: "
                       f"{', '.join((MINIATURE, *FUZZ_STACKS))}")
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
            elif known.acts_on is Component.TARGET and self.serving == MINIATURE:
                # the patch lands in a target's code, which the harness's own stack never calls: nothing to find
                out.append(f"--fault: {fault} patches a target's own code; fuzz it over that target's stack "
                           f"(--serving {', --serving '.join(FUZZ_STACKS) or 'NAME'})")
        if not out:  # what the backend declares it cannot run, on this machine's device
            out.extend(f"--backend: {why}" for why in
                       backend_class(self.backend).unsupported(mode=self.mode, device="cpu", faults=self.faults))
        return out


__all__ = ["FuzzTarget"]
