"""The CLI loads without torch and gymnasium: `surreal-redis --help`, `status` and `stop` stay fast
(torch alone takes ~1.5 s to import on 2 cores); commands import what they need when they run."""

import subprocess
import sys


def test_cli_module_imports_neither_torch_nor_gymnasium():
    code = ("import sys, surreal_redis.cli; "
            "print(sorted(m for m in ('torch', 'gymnasium', 'mlflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_help_runs_without_importing_torch():
    code = ("import sys; from click.testing import CliRunner; from surreal_redis.cli import main; "
            "r = CliRunner().invoke(main, ['--help']); assert r.exit_code == 0, r.output; "
            "assert 'launch' in r.output; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
