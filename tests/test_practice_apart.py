"""`lumen practice check` runs the learner's code apart (issue 38, item 2): a learner's file that ends the
process, runs forever, eats memory, or patches torch's comparisons, lumen's checks or the report never passes,
and the command says what happened in one line.

Each case goes through the real command line (`lumen.cli.main`, in this process, as the `lumen` script runs
it): before the learner's code ran apart, every one of them passed (exit 0) or ended or hung the command
itself. The last test runs the process-ending ones through `python -m lumen` in a subprocess (slow).
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lumen import practice
from lumen.cli import main
from lumen.practice import norms, probes
from lumen.practice.exercise import Report

KEPT = (probes.differs, norms.differs, probes.expect_close, Report.passed, Report.failed)

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "tests" / "practice_solutions"

NOOP_GELU = "def gelu(x):\n    return x\n"          # wrong: the identity, not GELU
NOOP_NORM = ("import torch.nn as nn\nclass LayerNorm(nn.Module):\n    def __init__(self, d, eps=1e-5):\n"
             "        super().__init__()\n        self.g = nn.Parameter(__import__('torch').ones(d))\n"
             "        self.b = nn.Parameter(__import__('torch').zeros(d))\n"
             "    def forward(self, x):\n        return x\n")

# name: (exercise, the file, extra arguments, exit code, what the one line (or the FAILED check) must say)
HOSTILE = {
    "os._exit in a check": ("gelu", "import os\ndef gelu(x):\n    os._exit(0)\n", [], 1,
                            "your code ended the process (exit code 0) before the checks finished"),
    "os._exit while importing": ("gelu", "import os\nos._exit(0)\n", [], 2,
                                 "importing it ended the process (exit code 0)"),
    "sys.exit in a check": ("gelu", "import sys\ndef gelu(x):\n    sys.exit(0)\n", [], 1,
                            "your code raised SystemExit("),
    "SystemExit('all checks passed')": ("gelu", "def gelu(x):\n    raise SystemExit('all checks passed')\n", [], 1,
                                        "your code raised SystemExit('all checks passed') (gelu.py line 2)"),
    "an atexit handler that exits 0": ("gelu", "import atexit, os\natexit.register(lambda: os._exit(0))\n" + NOOP_GELU,
                                       [], 1, "FAILED"),
    "a kill of its own process": ("gelu", "import os, signal\ndef gelu(x):\n    os.kill(os.getpid(), signal.SIGKILL)\n",
                                  [], 1, "your code ended the process (killed by signal 9)"),
    "an endless loop": ("gelu", "def gelu(x):\n    while True:\n        pass\n", ["--timeout", "1"], 1,
                        "your code timed out after 1 s (an endless loop? a sleep?)"),
    "a sleep while importing": ("gelu", "import time\ntime.sleep(1000)\n" + NOOP_GELU, ["--timeout", "1"], 2,
                                "importing it timed out after 1 s"),
    "a huge tensor": ("gelu", "import torch\ndef gelu(x):\n    return torch.ones(2**40) * 0 + x\n", [], 1,
                      "your code ran out of memory (gelu.py line 3)"),
    "a huge bytearray": ("gelu", "def gelu(x):\n    b = bytearray(3 * 2**30)\n    return x\n", ["--memory", "1"], 1,
                         "your code ran out of memory (gelu.py line 2)"),
    "torch.allclose patched": ("gelu", "import torch\ntorch.allclose = lambda *a, **k: True\n" + NOOP_GELU, [], 1,
                               "FAILED"),
    "torch.equal patched": ("layernorm", "import torch\ntorch.equal = lambda *a, **k: True\n"
                            "torch.allclose = lambda *a, **k: True\n" + NOOP_NORM, [], 1, "FAILED"),
    "torch.randn patched to zeros": ("layernorm", "import torch\n_z = torch.zeros\n"
                                     "torch.randn = lambda *s, **k: _z(*s, **k)\n" + NOOP_NORM, [], 1, "FAILED"),
    "the report's verdict patched": ("gelu", "import sys, lumen.practice\n"
                                     "exercise = sys.modules['lumen.practice.exercise']\n"
                                     "exercise.Report.passed = property(lambda self: True)\n"
                                     "exercise.Report.failed = property(lambda self: [])\n" + NOOP_GELU, [], 1,
                                     "FAILED"),
    "the comparisons patched": ("layernorm", "from lumen.practice import probes, norms\n"
                                "probes.differs = norms.differs = lambda *a, **k: False\n"
                                "probes.expect_close = norms.expect_close = lambda *a, **k: None\n" + NOOP_NORM, [], 1,
                                "FAILED"),
    "the command patched": ("gelu", "import lumen.cli.practice as c\nc._check = lambda *a: 0\n"
                            "import lumen.practice as p\np.check_file = lambda *a, **k: None\n" + NOOP_GELU, [], 1,
                            "FAILED"),
    "a pass printed by the learner": ("gelu", "print('all 3 checks passed.')\n" + NOOP_GELU, [], 1, "FAILED"),
}


def _check(tmp_path: Path, name: str, source: str, extra: list[str], capsys) -> tuple[int, str, str]:
    path = tmp_path / practice.exercise(name).file_name
    path.write_text(source)
    rc = main(["practice", "check", name, str(path), *extra])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_solution_does_not_pass_and_is_said_in_one_line(case, tmp_path, capsys):
    name, source, extra, code, said = HOSTILE[case]
    _check(tmp_path, name, NOOP_NORM if name == "layernorm" else NOOP_GELU, [], capsys)   # imports done
    allclose, equal, randn = torch.allclose, torch.equal, torch.randn
    handlers = atexit._ncallbacks()
    start = time.monotonic()
    rc, out, err = _check(tmp_path, name, source, extra, capsys)
    assert rc == code, out + err
    assert time.monotonic() - start < 30
    assert "Traceback" not in out + err
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("lumen practice: error: "), err
        assert said in lines[0], lines[0]
    else:
        assert said in " ".join(out.split()), out
        assert out.strip().splitlines()[-1].split(" failed")[0].isdigit(), out   # "N failed, ..."
    # nothing the learner's code patched reached this process
    assert (torch.allclose, torch.equal, torch.randn) == (allclose, equal, randn)
    assert practice.exercise.__module__ == "lumen.practice" and practice.check_file.__module__ == "lumen.practice"
    assert (probes.differs, norms.differs, probes.expect_close) == KEPT[:3]
    assert (Report.passed, Report.failed) == KEPT[3:]
    assert atexit._ncallbacks() == handlers   # no exit handler left for the checker's own end


def test_the_checks_after_a_process_ends_are_skipped_with_the_reason(tmp_path):
    path = tmp_path / "gelu.py"
    path.write_text("import os\ndef gelu(x):\n    os._exit(3)\n")
    report = practice.check_file("gelu", path)
    assert [o.status for o in report.outcomes] == ["failed", "skipped", "skipped"]
    assert report.failed[0].hint == "ended" and "exit code 3" in report.failed[0].seen
    assert "process is gone" in report.outcomes[1].seen
    assert practice.exercise("gelu").hint("ended")   # a hint every exercise has


def test_an_exception_shows_the_learners_file_and_line_and_a_shape_error_keeps_its_hint(tmp_path):
    path = tmp_path / "layernorm.py"
    path.write_text((SOLUTIONS / "wrong" / "layernorm__keepdim.py").read_text())
    report = practice.check_file("layernorm", path)
    assert {o.hint for o in report.failed} == {"keepdim"}   # the RuntimeError the check catches is still one


def test_a_time_limit_is_per_check_and_a_slow_correct_solution_passes(tmp_path):
    path = tmp_path / "gelu.py"
    path.write_text("import time, torch\ndef gelu(x):\n    time.sleep(0.05)\n"
                    "    return x * 0.5 * (1 + torch.erf(x / 2 ** 0.5))\n")
    assert practice.check_file("gelu", path, timeout=5).passed


def test_no_process_is_left_behind(tmp_path):
    """Neither the learner's process nor one it started outlives the check."""
    pid_file = tmp_path / "pid"
    path = tmp_path / "gelu.py"
    path.write_text(f"import os, time\npid = os.fork()\nif pid == 0:\n    time.sleep(1000)\n"
                    f"open({str(pid_file)!r}, 'w').write(f'{{os.getpid()}} {{pid}}')\n" + NOOP_GELU)
    assert not practice.check_file("gelu", path).passed
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)   # no child of ours, running or a zombie
    time.sleep(0.2)
    for pid in map(int, pid_file.read_text().split()):   # the learner's process, and the one it forked
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"), pid


@pytest.mark.parametrize("flag", ["--timeout", "--memory"])
def test_a_limit_that_is_not_a_positive_number_is_one_line(flag, tmp_path, capsys):
    rc, out, err = _check(tmp_path, "gelu", NOOP_GELU, [flag, "0"], capsys)
    assert rc == 2 and err.strip().startswith(f"lumen practice: error: {flag} 0: give a number above 0"), err


@pytest.mark.slow
def test_the_process_ending_ones_through_the_lumen_command(tmp_path):
    """As a learner types it: `python -m lumen practice check` in a process of its own."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "code")}
    for case in ("os._exit in a check", "os._exit while importing", "SystemExit('all checks passed')",
                 "an atexit handler that exits 0", "an endless loop", "torch.allclose patched"):
        name, source, extra, code, said = HOSTILE[case]
        path = tmp_path / practice.exercise(name).file_name
        path.write_text(source)
        done = subprocess.run([sys.executable, "-m", "lumen", "practice", "check", name, str(path), *extra],
                              capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == code, (case, done.stdout, done.stderr)
        assert said in " ".join((done.stdout + done.stderr).split()), (case, done.stdout, done.stderr)


def test_no_file_descriptor_is_left_open(tmp_path):
    fds = len(os.listdir("/proc/self/fd"))
    for source in ("import os\ndef gelu(x):\n    os._exit(0)\n", "def gelu(x):\n    while True:\n        pass\n",
                   "import os\nos._exit(0)\n", NOOP_GELU):
        path = tmp_path / "gelu.py"
        path.write_text(source)
        try:
            practice.check_file("gelu", path, timeout=0.5)
        except practice.PracticeError:
            pass
    assert len(os.listdir("/proc/self/fd")) == fds


def test_what_is_not_data_comes_back_as_its_type(tmp_path):
    path = tmp_path / "gelu.py"
    path.write_text("def gelu(x):\n    return (v for v in x)\n")
    report = practice.check_file("gelu", path)
    assert "gelu(x) returned generator, not a torch.Tensor" in report.failed[0].seen


def test_the_checker_reads_only_well_formed_answers():
    """What the learner's process sends is read with json and torch.frombuffer, bounds checked."""
    from lumen.practice import wire

    packer = wire.Packer()
    entry = packer.value((torch.arange(6.0).view(2, 3), [1, "a", None, ...], {"k": 2.5}))
    blob = b"".join(packer.chunks)
    got = wire.Unpacker(blob).value(entry)
    assert torch.equal(got[0], torch.arange(6.0).view(2, 3)) and got[1] == [1, "a", None, ...] and got[2] == {"k": 2.5}
    t = entry["v"][0]
    for forged in ({**t, "at": 8}, {**t, "n": 4}, {**t, "shape": [4, 3]}, {**t, "dtype": "object"},
                   {**t, "shape": [-2, -3]}, {"$": "pickle", "v": "gASVAAAAAAAAAAA="}, [1, 2]):
        with pytest.raises(wire.Garbled):
            wire.Unpacker(blob).value(forged)


def test_lumens_own_code_imported_is_noted_and_a_subclass_that_keeps_its_forward_too(tmp_path, capsys):
    for source in ("from lumen.block import LayerNorm\n", "import lumen.block\n"
                   "class LayerNorm(lumen.block.LayerNorm):\n    pass\n"):
        rc, out, _ = _check(tmp_path, "layernorm", source, [], capsys)
        assert rc == 0 and "note: LayerNorm is lumen's own lumen.block.LayerNorm" in out, out
    assert not practice.check_file("layernorm", SOLUTIONS / "other" / "layernorm__formula.py").notes
