"""GPU tests run on a lent machine whose time is short: each gets a 300 s ceiling (pytest-timeout, which
must be installed there too), so a hang fails that test with every thread's stack instead of eating the
lease."""

import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(300))
