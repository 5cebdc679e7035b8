"""The plugin where an engine keeps its own scenarios: found through its entry point with no conftest, and
a scenario file named on the command line collected wherever it lives."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from .conftest import sample_text

QUIET = ("-p", "no:cacheprovider")


def test_the_plugin_is_registered_as_a_pytest11_entry_point_under_its_module_name():
    # under the module's own name, so a conftest's pytest_plugins or `-p harness.plugin` finds it registered
    found = {(ep.name, ep.value) for ep in metadata.entry_points(group="pytest11")}
    assert ("harness.plugin", "harness.plugin") in found


def test_a_scenario_file_named_on_the_command_line_is_collected_outside_a_scenarios_folder(harness_pytester):
    folder = harness_pytester.path / "engine_checks"
    folder.mkdir()
    (folder / "mine.toml").write_text(sample_text("tiny_match"))
    (harness_pytester.path / "settings.toml").write_text("[tool]\nname = 'not a scenario'\n")

    named, _ = harness_pytester.inline_genitems(*QUIET, "engine_checks/mine.toml")
    assert named and {item.path.name for item in named} == {"mine.toml"}
    walked, _ = harness_pytester.inline_genitems(*QUIET, ".")
    assert not [item for item in walked if item.path.suffix == ".toml"]  # a folder walk keeps the old rule


@pytest.mark.slow
def test_pytest_in_a_folder_without_conftest_collects_a_named_scenario_through_the_entry_point(tmp_path: Path):
    # collection is the claim (running items is the plugin's own tests' job): no conftest, no -p, no PYTHONPATH
    (tmp_path / "mine.toml").write_text(sample_text("tiny_match"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTEST_PLUGINS")}
    proc = subprocess.run([sys.executable, "-m", "pytest", *QUIET, "-p", "no:xdist", "--collect-only", "-q",
                           "mine.toml"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "mine.toml::mine[forward_batch-eager-torch_native]" in proc.stdout
