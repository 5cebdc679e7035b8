"""Root conftest: loads the harness's pytest plugin (scenario collection, markers, GPU skips) and
pytester, which the plugin's own tests drive (pytest only honours pytest_plugins at the root)."""

pytest_plugins = ["harness.plugin", "pytester"]
