"""Minimal shim: metadata lives in setup.cfg.

The Lua scripts and configs live at the top of the repository (``lua/``, ``configs/``) and are
copied into the package as ``surreal_redis/lua`` and ``surreal_redis/configs`` so that a plain
``pip install`` (not only an editable checkout) ships them.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).parent
DATA_DIRS = {"lua": "*.lua", "configs": "*.yaml"}


class BuildPyWithData(build_py):
    def run(self) -> None:
        super().run()
        for folder, pattern in DATA_DIRS.items():
            target = Path(self.build_lib) / "surreal_redis" / folder
            target.mkdir(parents=True, exist_ok=True)
            for source in sorted((ROOT / folder).glob(pattern)):
                (target / source.name).write_bytes(source.read_bytes())


setup(cmdclass={"build_py": BuildPyWithData})
