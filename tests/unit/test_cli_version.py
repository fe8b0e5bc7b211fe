"""``surreal-redis --version`` prints the installed distribution's version (its metadata, which
setup.cfg sets), and nothing else runs: no logging setup, no Redis."""

from __future__ import annotations

import importlib.metadata

from click.testing import CliRunner

import surreal_redis
from surreal_redis.cli import main


def test_version_is_the_package_metadata_version():
    result = CliRunner().invoke(main, ["--version"], prog_name="surreal-redis")
    assert result.exit_code == 0, result.output
    assert result.output == f"surreal-redis, version {importlib.metadata.version('surreal-redis')}\n"
    assert surreal_redis.__version__ == importlib.metadata.version("surreal-redis")  # setup.cfg's, one number


def test_version_needs_no_subcommand_and_ignores_the_ones_after_it():
    result = CliRunner().invoke(main, ["--version", "launch", "no-such-config"], prog_name="surreal-redis")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("surreal-redis, version ")
