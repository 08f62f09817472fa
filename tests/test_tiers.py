"""How `make test` runs the default tier: one pytest process per core (pytest-xdist's `-n auto`, sized by
tests/conftest.py), each with its share of the cores as torch's threads, and so the commands its tests start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lumen.runtime.cpu import cpu_count

TESTS = Path(__file__).resolve().parent

# a test that writes down, in its process, torch's threads and those of a command it starts
PROBE = '''
import json
import os
import subprocess
import sys
from pathlib import Path

import torch


def test_threads():
    command = [sys.executable, "-c", "import torch; print(torch.get_num_threads())"]
    child = int(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    Path(os.environ["PROBE_OUT"]).write_text(json.dumps([torch.get_num_threads(), child]))
'''


@pytest.mark.slow  # (a pytest of two processes: ~12 s)
def test_each_process_takes_its_share_of_the_cores_as_threads(tmp_path):
    (tmp_path / "test_probe.py").write_text(PROBE)
    out = tmp_path / "threads.json"
    # as a user's shell has it: no thread count, and none of the workers' marks of an outer `pytest -n` (through
    # which the probe's processes would take the share from this one, not from their own conftest)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS" and not k.startswith("PYTEST_XDIST")}
    env.update(PYTHONPATH=str(TESTS), PROBE_OUT=str(out))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "conftest", "-p", "no:cacheprovider",
                          "--rootdir", str(tmp_path), str(tmp_path / "test_probe.py")],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    share = max(1, cpu_count() // 2)
    assert json.loads(out.read_text()) == [share, share]
