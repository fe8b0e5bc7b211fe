"""The package type-checks clean under mypy at the strictness mypy.ini states, and says so to its
users' type checkers (PEP 561: ``surreal_redis/py.typed``). A cold run takes about a minute on two
cores; mypy's cache (``.mypy_cache`` in the checkout) makes later runs take seconds."""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest
from mypy import api

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "mypy.ini"
STRICTNESS = ("check_untyped_defs", "no_implicit_optional", "warn_unused_ignores", "warn_redundant_casts",
              "strict_equality")


def test_mypy_config_keeps_its_stated_strictness():
    config = configparser.ConfigParser()
    config.read(CONFIG)
    loosened = [flag for flag in STRICTNESS if not config.getboolean("mypy", flag, fallback=False)]
    assert not loosened, f"mypy.ini no longer sets {loosened}"
    assert not config.getboolean("mypy", "ignore_missing_imports", fallback=False), \
        "ignore_missing_imports belongs in per-module sections, for libraries without stubs"
    assert (ROOT / "surreal_redis" / "py.typed").is_file()


@pytest.mark.timeout(900)
def test_the_package_has_no_type_errors():
    stdout, stderr, status = api.run(["--config-file", str(CONFIG), "--cache-dir", str(ROOT / ".mypy_cache"),
                                      str(ROOT / "surreal_redis")])
    assert status == 0 and stdout.startswith("Success"), f"mypy found errors:\n{stdout}{stderr}"
