"""lumen.features against the sae-lens package itself, which runs in a virtual environment of its own
(`make saelens-venv`: sae-lens and TransformerLens beside the same torch): a dictionary saved by SAELens is read
by lumen, and one saved by lumen is read by SAELens, each with the same encode/decode outputs to float32
rounding, and each architecture stays what it was (a TopK stays a TopK)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from lumen.features import SAE, JumpReLU, ReLU, TopK, Transcoder, read_saelens, save_saelens

pytestmark = pytest.mark.slow

PYTHON = Path(os.environ.get("LUMEN_SAELENS_PYTHON", Path.home() / ".cache/lumen-tools/saelens/bin/python"))

# run by sae-lens's interpreter: make (or read) a dictionary, and write its outputs on the inputs given
SCRIPT = r"""
import json, sys
import numpy as np, torch
import sae_lens
from sae_lens import SAE
from sae_lens.saes.sae import SAEMetadata
from sae_lens.saes.topk_sae import TopKSAE, TopKSAEConfig
from sae_lens.saes.standard_sae import StandardSAE, StandardSAEConfig
from sae_lens.saes.jumprelu_sae import JumpReLUSAE, JumpReLUSAEConfig
from sae_lens.saes.transcoder import SkipTranscoder, SkipTranscoderConfig

job = json.loads(sys.argv[1])
x = torch.from_numpy(np.load(job["inputs"]))
if job["make"]:
    meta = SAEMetadata(hook_name="blocks.1.hook_resid_post")
    kinds = {"topk": (TopKSAE, TopKSAEConfig, {"k": 3}), "standard": (StandardSAE, StandardSAEConfig, {}),
             "jumprelu": (JumpReLUSAE, JumpReLUSAEConfig, {}),
             "skip_transcoder": (SkipTranscoder, SkipTranscoderConfig, {"d_out": 6, "apply_b_dec_to_input": False})}
    cls, cfg_cls, extra = kinds[job["make"]]
    if job["make"] == "skip_transcoder":
        meta = SAEMetadata(hook_name="blocks.0.ln2.hook_normalized", hook_name_out="blocks.0.hook_mlp_out")
    torch.manual_seed(0)
    sae = cls(cfg_cls(d_in=8, d_sae=24, metadata=meta, **extra))
    with torch.no_grad():
        for p in sae.parameters():
            p.normal_()
        if hasattr(sae, "threshold"):
            sae.threshold.uniform_(0, 1)
    sae.save_model(job["dir"])
else:
    sae = SAE.load_from_disk(job["dir"])
f = sae.encode(x)
np.save(job["features"], f.detach().numpy())
np.save(job["out"], sae(x).detach().numpy())
print(json.dumps({"class": type(sae).__name__}))
"""


@pytest.fixture(scope="module")
def saelens():
    if not PYTHON.is_file():
        pytest.skip(f"sae-lens's environment is missing ({PYTHON}): make saelens-venv")

    def run(tmp: Path, make: str | None, folder: Path, x: np.ndarray) -> tuple[str, np.ndarray, np.ndarray]:
        np.save(tmp / "x.npy", x)
        job = {"make": make, "dir": str(folder), "inputs": str(tmp / "x.npy"), "features": str(tmp / "f.npy"),
               "out": str(tmp / "out.npy")}
        done = subprocess.run([str(PYTHON), "-c", SCRIPT, json.dumps(job)], capture_output=True, text=True,
                              timeout=300, env={**os.environ, "PYTHONPATH": ""})
        assert done.returncode == 0, done.stderr[-3000:]
        cls = json.loads(done.stdout.strip().splitlines()[-1])["class"]
        return cls, np.load(tmp / "f.npy"), np.load(tmp / "out.npy")

    return run


X = np.random.default_rng(0).standard_normal((7, 8)).astype(np.float32)


@pytest.mark.parametrize("arch, lumen_act", [("topk", TopK), ("standard", ReLU), ("jumprelu", JumpReLU),
                                             ("skip_transcoder", ReLU)])
def test_a_dictionary_saved_by_saelens_reads_in_lumen_to_the_same_outputs(saelens, tmp_path, arch, lumen_act):
    _, f, out = saelens(tmp_path, arch, tmp_path / "d", X)
    sae = read_saelens(tmp_path / "d")
    assert type(sae.act) is lumen_act and isinstance(sae, Transcoder) == (arch == "skip_transcoder")
    x = torch.from_numpy(X)
    np.testing.assert_allclose(sae.encode(x).detach().numpy(), f, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sae(x).detach().numpy(), out, rtol=1e-5, atol=1e-5)


def lumen_dictionary(kind: str) -> SAE:
    torch.manual_seed(1)
    sae: SAE
    if kind == "transcoder":
        sae = Transcoder(8, 24, ReLU(), "blocks.0.mlp_in", "blocks.0.mlp_out", d_out=6, skip=True)
    else:
        act = {"topk": TopK(3), "standard": ReLU(), "jumprelu": JumpReLU(24)}[kind]
        sae = SAE(8, 24, act, "blocks.2.resid_pre")
    with torch.no_grad():
        for p in sae.parameters():
            p.normal_()
    return sae


@pytest.mark.parametrize("kind, saelens_class", [("topk", "TopKSAE"), ("standard", "StandardSAE"),
                                                 ("jumprelu", "JumpReLUSAE"), ("transcoder", "SkipTranscoder")])
def test_a_dictionary_saved_by_lumen_reads_in_saelens_to_the_same_outputs(saelens, tmp_path, kind, saelens_class):
    sae = lumen_dictionary(kind)
    save_saelens(sae, tmp_path / "d")
    cls, f, out = saelens(tmp_path, None, tmp_path / "d", X)
    assert cls == saelens_class   # a TopK stays a TopK
    x = torch.from_numpy(X)
    np.testing.assert_allclose(f, sae.encode(x).detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out, sae(x).detach().numpy(), rtol=1e-5, atol=1e-5)
