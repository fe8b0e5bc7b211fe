"""Learner, agent and eval processes end with os._exit (no interpreter teardown): the exit code
is the one returned, and what was printed or logged but still buffered reaches the pipe."""

import os
import subprocess
import sys


def test_exit_process_keeps_the_code_and_flushes_logs_and_stdio():
    code = ("import logging, sys; from surreal_redis.cli.common import _exit_process; "
            "logging.basicConfig(stream=sys.stdout, format='%(message)s'); "
            "logging.getLogger('x').warning('logged'); sys.stderr.write('to stderr\\n'); "
            "sys.stdout.write('printed last'); _exit_process(3)")
    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=buffered)
    assert done.returncode == 3
    assert done.stdout.splitlines() == ["logged", "printed last"]  # a pipe: stdout is block-buffered
    assert done.stderr == "to stderr\n"
