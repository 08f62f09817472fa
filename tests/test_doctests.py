"""The examples in lumen's docstrings run and print what they say. A module whose examples need a download
(SmolLM2, the Shakespeare corpus) or a trained model keeps them as `+SKIP` and is listed in NOT_RUN with
the reason, so a new module with examples must be put in one list or the other."""

from __future__ import annotations

import doctest
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "code"

RUNNABLE = [
    "lumen.accounting",
    "lumen.config",
    "lumen.decode",
    "lumen.errors",
    "lumen.evaluate",
    "lumen.formats.weights",
    "lumen.experiments.result",
    "lumen.experiments.stacks",
    "lumen.fast.attention",
    "lumen.fast.changes",
    "lumen.fast.quads",
    "lumen.features",
    "lumen.features.dictionary",
    "lumen.inspect",
    "lumen.inspect.cache",
    "lumen.inspect.finite",
    "lumen.inspect.heads",
    "lumen.inspect.hooks",
    "lumen.inspect.readout",
    "lumen.inspect.stack",
    "lumen.inspect.weights",
    "lumen.model",
    "lumen.names",
    "lumen.practice",
    "lumen.practice.solution",
    "lumen.tokenizers",
    "lumen.tokenizers.batch",
    "lumen.tokenizers.chat",
    "lumen.tokenizers.kinds",
    "lumen.tokenizers.shown",
    "lumen.train",
    "lumen.train.config",
    "lumen.train.optim",
]
NOT_RUN = {
    "lumen.data": "the Shakespeare corpus",
    "lumen.experiments": "an experiment takes minutes",
    "lumen.experiments.fit": "the Shakespeare corpus",
    "lumen.fast.aot": "AOTInductor builds a package (minutes)",
    "lumen.fetch": "a download",
    "lumen.features.quality": "a model and a dictionary worth measuring",
    "lumen.features.saelens": "a SAELens folder",
    "lumen.features.train": "a model and minutes of training (tests/test_features_train.py trains tiny ones)",
    "lumen.features.splice": "a model and a dictionary (tests/test_features.py splices known ones)",
    "lumen.features.tools": "a model and a dictionary (tests/test_features.py has known answers)",
    "lumen.files": "writes into the working directory",
    "lumen.formats": "SmolLM2",
    "lumen.formats.checkpoint": "a trained run",
    "lumen.formats.gguf": "SmolLM2",
    "lumen.formats.hf": "a Hugging Face directory",
    "lumen.inspect.ablate": "a trained model and a corpus",
    "lumen.inspect.attribution": "SmolLM2 (tests/test_attribution.py checks the sums on random models)",
    "lumen.inspect.patching": "SmolLM2 (tests/test_patching.py has the known answers)",
    "lumen.inspect.attribution_patching": "SmolLM2 (tests/test_patching_scale.py checks it where it is exact)",
    "lumen.inspect.path_patching": "SmolLM2 (tests/test_patching_scale.py has a model with a known path)",
    "lumen.inspect.corpus": "the Shakespeare corpus",
    "lumen.inspect.lens": "SmolLM2",
    "lumen.inspect.datasets": "SmolLM2 and a file of prompts (tests/test_cli_prompts.py: the commands' numbers)",
    "lumen.prompts": "a file of prompts (tests/test_cli_prompts.py reads many)",
    "lumen.inspect.neurons": "SmolLM2",
    "lumen.inspect.tuned_lens": "a trained lens",
    "lumen.fast": "a model to make fast, and minutes of compiling",
    "lumen.fast.decoding": "minutes of compiling",
    "lumen.fast.packing": "SmolLM2",
    "lumen.fast.loading": "SmolLM2's GGUF file",
    "lumen.fast.quant": "SmolLM2's GGUF file",
    "lumen.runtime.compiling": "minutes of compiling",
    "lumen.progress": "draws on a terminal",
    "lumen.practice.verdict": "reads a learner's practice folder",
    "lumen.report.explore": "SmolLM2",
    "lumen.report.serve": "starts a server",
    "lumen.runtime.threads": "times real work",
    "lumen.runtime.cpu": "its answers are this machine's CPU's",
    "lumen.runtime.cache": "its answer is this machine's home folder",
    "lumen.train.budget": "times a run's real steps",
    "lumen.report.figures": "a lens result",
    "lumen.report.html": "a lens result",
    "lumen.train.loop": "a training run takes minutes",
    "lumen.train.machine": "a run's config",
}


def modules_with_examples() -> set[str]:
    names = set()
    for path in (ROOT / "lumen").rglob("*.py"):
        if re.search(r"^\s*>>> ", path.read_text(), re.M):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_every_module_with_examples_is_run_or_says_why_not():
    assert modules_with_examples() == set(RUNNABLE) | set(NOT_RUN)
    assert not set(RUNNABLE) & set(NOT_RUN)


@pytest.mark.parametrize("name", RUNNABLE)
def test_docstring_examples_run(name, capsys):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = capsys.readouterr().out
    assert result.failed == 0, report
    assert result.attempted > 0, f"{name} has no example that runs"
