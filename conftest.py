"""Root conftest: loads the harness's pytest plugin (scenario collection, markers, GPU skips)."""

pytest_plugins = ["harness.plugin"]
