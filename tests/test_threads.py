"""The cpu backend's threads yield on a shared machine (tinyspec/fast/threads.py): OpenMP's idle workers sleep
unless the user chose otherwise, and --threads sets the count, checked before a model loads."""

import subprocess
import sys

from tinyspec.__main__ import main
from tinyspec.fast import threads


def test_idle_workers_sleep_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    threads.yield_when_idle()
    import os

    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    threads.yield_when_idle()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_a_cpu_model_loads_with_yielding_workers():
    """In a fresh process, loading a cpu model sets the policy before any parallel kernel has run."""
    code = ("import os; os.environ.pop('OMP_WAIT_POLICY', None)\n"
            "from tinyspec.backends import load_model\nfrom tinyspec.demo import TARGET\n"
            "load_model(TARGET, 'cpu'); print(os.environ['OMP_WAIT_POLICY'])")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "PASSIVE", run.stderr


def test_threads_flag_is_checked_before_a_model_loads(capsys):
    import numba

    top = numba.config.NUMBA_NUM_THREADS
    assert main(["generate", "--prompt", "hi", "--threads", str(top + 1)]) == 2
    err = capsys.readouterr().err
    assert f"--threads must be in 1..{top}" in err and "loading" not in err
    assert main(["generate", "--prompt", "hi", "--threads", "0"]) == 2
    assert threads.set_threads(1) == 1
    threads.set_threads(top)
