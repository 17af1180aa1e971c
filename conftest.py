"""Loads mdb's pytest plugin (``mdb.testing.plugin``) where mdb was installed before it
registered the plugin's ``pytest11`` entry point (an older editable install); an install of
this version loads it by the entry point, and this does nothing."""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.hasplugin("mdb"):
        config.pluginmanager.import_plugin("mdb.testing.plugin")
