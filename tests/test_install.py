"""A plain install runs every command: a fresh virtual environment (no system site-packages), the pinned CPU
torch, then a non-editable `pip install .` with no extras, and the commands a new user types first.

torch comes from pip's configured sources as `make setup` installs it; the rest comes from the package index
(a few minutes the first time). SmolLM2 is read from the already-fetched cache, never downloaded here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lumen.runtime.cache import cache_dir

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"  # the Makefile's pin


def _sh(cmd: list[str], cwd: Path, timeout: int = 900) -> str:
    """Run cmd as a user's shell would, without this process's PYTHONPATH or virtual environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(LUMEN_CACHE=str(cache_dir()), LUMEN_OFFLINE="1")  # SmolLM2 from the cache, never downloaded
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(cmd)}: exit {done.returncode}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.slow
def test_a_plain_install_runs_every_command(tmp_path, smollm2_gguf):
    # the source as a user gets it, outside this checkout, so the build leaves nothing behind here
    src = tmp_path / "src"
    shutil.copytree(ROOT / "code", src / "code", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md", "constraints.txt"):
        shutil.copy(ROOT / name, src / name)
    venv = tmp_path / "venv"
    _sh([sys.executable, "-m", "venv", str(venv)], tmp_path)  # a real fresh environment: no site-packages shared
    py, lumen = venv / "bin" / "python", venv / "bin" / "lumen"
    _sh([str(py), "-m", "pip", "install", "-q", TORCH], tmp_path)
    _sh([str(py), "-m", "pip", "install", "-q", "-c", str(src / "constraints.txt"), str(src)], tmp_path)
    # installed, not linked: the package lives in the venv's site-packages, and so does every dependency
    where = _sh([str(py), "-c", "import lumen, matplotlib; print(lumen.__file__, matplotlib.__file__)"], tmp_path)
    assert all(Path(f).is_relative_to(venv) for f in where.split()), where

    out = _sh([str(lumen), "count", "gpt2"], tmp_path)
    assert "124,439,808" in out  # GPT-2 small's exact tensor count, as transformers counts it
    out = _sh([str(lumen), "generate", "smollm2", "--prompt", "The capital of France is", "--temperature", "0",
               "--max-new-tokens", "3"], tmp_path)
    assert "Paris" in out
    lens = json.loads(_sh([str(lumen), "lens", "smollm2", "--prompt", "The capital of France is", "--json"], tmp_path))
    final = lens["logit lens"]["layers"][-1]  # the last layer's lens is the model's own output
    assert final["after"] == "block 29" and final["top"][-1][0][0] == " Paris"
