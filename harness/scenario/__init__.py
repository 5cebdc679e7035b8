"""Scenario files: one TOML file per scenario, read into a ``ScenarioSpec`` and validated in full.

``load_scenario`` / ``load_all`` read files; ``check_scenario`` validates a spec however it was made;
``scenario_toml`` writes a spec back out as a file that loads to an equal spec; ``scenario_of`` makes a
scenario of one generated ``RunSpec``, its expectations from the designs' declarations.
"""

from .loader import (
    SCENARIO_ROOT_DEFAULT,
    ScenarioError,
    check_scenario,
    discover,
    load_all,
    load_scenario,
)
from .generated import scenario_of
from .spec import BackendExpectation, Expectation, ScenarioSpec
from .writer import scenario_toml

__all__ = [
    "SCENARIO_ROOT_DEFAULT",
    "BackendExpectation",
    "Expectation",
    "ScenarioError",
    "ScenarioSpec",
    "check_scenario",
    "discover",
    "load_all",
    "load_scenario",
    "scenario_of",
    "scenario_toml",
]
