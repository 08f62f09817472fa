"""The chapter tour (docs/notebooks/chapter-tour.ipynb) runs from top to bottom, executed by nbclient in a
fresh kernel, so it cannot rot: its cells run lumen's commands and `lumen practice check` on solutions they
write, and assert what they show."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "docs" / "notebooks" / "chapter-tour.ipynb"

# the chapter's headings the tour walks through, in its order
SECTIONS = ["The problem: mixing is not thinking", "The feed-forward block (MLP)", "GELU, and why not ReLU",
            "Residual connections: the stream", "LayerNorm: keeping the stream well-behaved",
            "The full transformer block", "Stacking N blocks: what the layers do", "Parameter accounting per block",
            "Dropout", "Initialisation and the 1/sqrt(2N) residual trick", "Compute: FLOPs per token"]


def test_the_tour_follows_the_chapter_and_is_stored_without_outputs():
    nb = json.loads(NOTEBOOK.read_text())
    headings = [line.lstrip("#").strip() for c in nb["cells"] if c["cell_type"] == "markdown"
                for line in "".join(c["source"]).splitlines() if line.startswith("##")]
    found = [next(i for i, h in enumerate(headings) if h.startswith(s)) for s in SECTIONS]
    assert found == sorted(found)
    assert all(not c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code")
    assert sum("lumen(\"practice\", \"check\"" in "".join(c["source"]) for c in nb["cells"]) >= 5


@pytest.mark.slow
def test_the_tour_runs(tmp_path, smollm2_gguf):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": tmp_path}})
    client.execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert outputs.count("checks passed") >= 5
    assert "' Paris'" in outputs or " Paris" in outputs
