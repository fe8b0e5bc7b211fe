import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "partitions: network partitions between hosts built from Linux network "
                                       "namespaces (needs root; skipped otherwise)")


@pytest.fixture(scope="session", autouse=True)
def _no_stale_labs():
    """Labs a killed test run left behind (namespaces and their processes) go first."""
    from support.netns import netns_unavailable, remove_stale_labs

    if netns_unavailable() is None:
        remove_stale_labs()
