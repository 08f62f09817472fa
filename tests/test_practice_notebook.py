"""The chapter tour (docs/notebooks/chapter-tour.ipynb) follows the chapter, leaves the learner's cells to the
learner (each is an exercise's starting file, as `lumen practice start` writes it, followed by a cell that
runs `lumen practice check` on it), and runs from top to bottom in a fresh kernel (nbclient, as `jupyter
execute` runs it) with a learner's answers put into those cells: every check passes and every claim cell's
assertion against lumen's code holds."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lumen import practice

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "docs" / "notebooks" / "chapter-tour.ipynb"
ANSWERS = ROOT / "tests" / "practice_solutions" / "other"   # a learner's own answers, written differently

# the chapter's headings the tour walks through, in its order
SECTIONS = ["The problem: mixing is not thinking", "The feed-forward block (MLP)", "GELU, and why not ReLU",
            "Residual connections: the stream", "LayerNorm: keeping the stream well-behaved",
            "The full transformer block", "Stacking N blocks: what the layers do", "Parameter accounting per block",
            "Dropout", "Initialisation and the 1/sqrt(2N) residual trick", "Compute: FLOPs per token"]
WRITES = re.compile(r"%%writefile tour/(\w+)\.py\n")


def _cells() -> list[dict]:
    return [{**c, "source": "".join(c["source"])} for c in json.loads(NOTEBOOK.read_text())["cells"]]


def _learners() -> list[tuple[int, str]]:
    """(cell index, exercise name) of each cell left for the learner."""
    found = []
    for i, c in enumerate(_cells()):
        if c["cell_type"] == "code" and (m := WRITES.match(c["source"])):
            found.append((i, next(e.name for e in practice.EXERCISES.values() if e.file_name == f"{m[1]}.py")))
    return found


def test_the_tour_follows_the_chapter_and_is_stored_without_outputs():
    cells = _cells()
    headings = [line.lstrip("#").strip() for c in cells if c["cell_type"] == "markdown"
                for line in c["source"].splitlines() if line.startswith("##")]
    found = [next(i for i, h in enumerate(headings) if h.startswith(s)) for s in SECTIONS]
    assert found == sorted(found)
    assert all(not c.get("outputs") for c in cells if c["cell_type"] == "code")


def test_the_learners_cells_are_left_to_the_learner_and_checked_by_lumen_practice():
    """Each learner cell is the exercise's starting file, unfilled; the cell after it runs the checker on it."""
    cells, learners = _cells(), _learners()
    assert len(learners) >= 5
    for i, name in learners:
        ex = practice.exercise(name)
        assert cells[i]["source"] == f"%%writefile tour/{ex.file_name}\n{ex.starting_file()}", name
        assert f'lumen("practice", "check", "{name}", "tour/{ex.file_name}")' in cells[i + 1]["source"], name
    # no cell writes an answer: nothing in the tour defines a learner's file but the starting files
    assert sum("write_text(" in c["source"] for c in cells) == 0


def test_the_tour_is_linked_from_the_readme_and_the_reading_guide():
    for page in ("README.md", "docs/reading-guide.md"):
        assert "docs/notebooks/chapter-tour.ipynb" in (ROOT / page).read_text(), page


@pytest.mark.slow
def test_the_tour_runs_with_a_learners_answers(tmp_path, smollm2_gguf):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for i, name in _learners():
        ex = practice.exercise(name)
        answer = next(ANSWERS.glob(f"{ex.file_name[:-3]}__*.py"))
        nb.cells[i].source = f"%%writefile tour/{ex.file_name}\n{answer.read_text()}"
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": tmp_path}})
    client.execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert outputs.count("checks passed") == len(_learners()) and "FAILED" not in outputs
    assert " Paris" in outputs
