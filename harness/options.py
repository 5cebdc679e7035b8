"""The options both front doors take, described once: ``--NAME`` on the command line (``cli.py``) and
``--harness-NAME`` under pytest (``plugin.py``). A front door adds an option by name, with what is its own:
the type that validates it (the CLI checks names while parsing, the plugin once pytest is configured) and its
default. A new shared option is one row here and one line in each front door.

Imports nothing: every pytest session loads the plugin, and its options must cost no torch.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True, kw_only=True)
class SharedOption:
    name: str
    """``--harness-{name}`` under pytest"""
    metavar: str
    help: str
    """what the option does through both front doors"""
    repeatable: bool = False
    cli_name: str | None = None
    """the command line's name where it differs (``--report-dir``)"""
    cli_help: str | None = None
    """the command line's help where its option does more (``--design`` also selects)"""

    @property
    def cli_flag(self) -> str:
        return f"--{self.cli_name or self.name}"

    @property
    def plugin_flag(self) -> str:
        return f"--harness-{self.name}"

    def attrs(self, *, cli: bool) -> dict[str, Any]:
        attrs: dict[str, Any] = {"metavar": self.metavar, "help": (self.cli_help or self.help) if cli else self.help}
        if self.repeatable:
            attrs["action"] = "append"
        return attrs


_ADDED = "a scenario does not list is added to its runs"

SHARED_OPTIONS: dict[str, SharedOption] = {o.name: o for o in (
    SharedOption(name="design", metavar="DESIGN", repeatable=True,
                 help="add this design (an import path 'package.module:function') to every scenario that does not "
                      "list it (repeatable)",
                 cli_help="only this design (repeatable): {designs}; an import path 'package.module:function' that "
                          f"{_ADDED}"),
    SharedOption(name="expect", metavar="VERDICT|like:DESIGN",
                 help="what designs added by import path should give: one verdict for every run, or like:DESIGN, "
                      "what each scenario expects of DESIGN in that run (default: {expect_default}); a fault "
                      "scenario also runs them with the faults off. Without this option a run under a scenario's "
                      "faults has no known verdict: it is information (does the fault reach the design?), never "
                      "unexpected, and its faults-off rerun is judged"),
    SharedOption(name="timeout", metavar="SECONDS",
                 help="each run's time limit (default: the scenario's run.timeout_s)"),
    SharedOption(name="backend", metavar="BACKEND", repeatable=True,
                 help="add this backend (an import path 'package.module:Class') to every scenario that does not list "
                      "it, each run expected to give what the "
                      "scenario expects of its design (repeatable)",
                 cli_help="restricts the runs to this backend's (repeatable: to these backends'); a GPU backend "
                          f"(flashinfer, trtllm_mha) or an import path 'package.module:Class' that {_ADDED}, "
                          "expected to give what the scenario expects of each design"),
    SharedOption(name="runner", metavar="MODE=package.module:Class", repeatable=True,
                 help="run this mode with this runner instead of the built-in one, expected to give what the "
                      "scenarios expect in that mode (repeatable, one per mode; the contract: docs/design.md)"),
    SharedOption(name="serving", metavar="STACK",
                 help="run every scenario on this serving stack instead of its [serving] stack: a registered one "
                      "(miniature, or a target's: sglang) or an import path 'package.module:Class'"),
    SharedOption(name="engine", metavar="{tape,cuda}", help="graph engine (default: tape on cpu, cuda on cuda)"),
    SharedOption(name="device", metavar="{cpu,cuda}",
                 help="where the runs' tensors live (default: cpu; cuda needs a CUDA device, and marks pytest's "
                      "items gpu)"),
    SharedOption(name="json", metavar="FILE",
                 help="write one JSON record per run to FILE (under pytest, every xdist worker's)"),
    SharedOption(name="report", cli_name="report-dir", metavar="DIR",
                 help="write the HTML report there: index.html, a page per scenario, results.json and .csv"),
)}
"""by name, in the order the front doors list them"""


class _Adds(Protocol):
    def addoption(self, *names: str, **attrs: Any) -> None: ...


def add_cli_option(parser: argparse.ArgumentParser, name: str, **own: Any) -> None:
    """Add the shared option ``name`` to a command's parser; ``own``: its type, default, and the values its
    help names (``{designs}``)."""
    option = SHARED_OPTIONS[name]
    attrs = option.attrs(cli=True)
    attrs["help"] = attrs["help"].format(**own.pop("help_values", {}))
    parser.add_argument(option.cli_flag, **{**attrs, **own})


def add_plugin_option(group: _Adds, name: str, **own: Any) -> None:
    """Add the shared option ``name`` to pytest's harness group; ``own`` as for ``add_cli_option``."""
    option = SHARED_OPTIONS[name]
    attrs = option.attrs(cli=False)
    attrs["help"] = attrs["help"].format(**own.pop("help_values", {}))
    group.addoption(option.plugin_flag, **{**attrs, **own})
