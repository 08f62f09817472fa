"""hf:ORG/NAME[@REVISION] specs: a real Hugging Face cache layout (models--ORG--NAME/blobs, snapshots/REV,
refs/main), built in a temporary HF_HOME from random weights, loads offline through lumen.formats.load
and the CLI; an uncached model offline is one clear error. No test touches the network (sockets fail)."""

import hashlib
import json
import os
import socket

import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

from lumen.cli import main
from lumen.errors import MissingFileError, UserError
from lumen.formats import load

V = 64
WORDS = ["[UNK]", "the", "cat", "sat", "on", "mat", "."]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("network access in a test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _pythia_shaped():
    torch.manual_seed(0)
    hf = GPTNeoXForCausalLM(GPTNeoXConfig(
        vocab_size=V, hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, rotary_pct=0.25, hidden_act="gelu")).eval()
    hf.config._attn_implementation = "eager"
    return hf


def _cache(home, repo, hf):
    """What `hf download` leaves: files stored once under blobs/ by hash, the snapshot folder of a commit
    linking to them, and refs/main naming that commit."""
    root = home / "hub" / f"models--{repo.replace('/', '--')}"
    staging = home / "staging"
    hf.save_pretrained(staging)
    tok = HFTokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(staging / "tokenizer.json"))
    snapshot = root / "snapshots" / COMMIT
    (root / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for f in staging.iterdir():
        blob = root / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        f.rename(blob)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / f.name)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(COMMIT)
    return snapshot


def test_hub_spec_loads_from_the_cache_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    hf = _pythia_shaped()
    _cache(tmp_path, "EleutherAI/pythia-70m", hf)
    idx = torch.randint(0, V, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(idx).logits
    for spec in ("hf:EleutherAI/pythia-70m", f"hf:EleutherAI/pythia-70m@{COMMIT}", "hf:EleutherAI/pythia-70m@main"):
        loaded = load(spec)
        assert loaded.model.cfg.name == spec and loaded.model.cfg.norm_placement == "parallel"
        with torch.no_grad():
            torch.testing.assert_close(loaded.model(idx)[0], ref, atol=1e-5, rtol=0)
        assert loaded.tokenizer.encode("the cat sat") == [1, 2, 3]
    with pytest.raises(MissingFileError, match="not in the Hugging Face cache"):
        load("hf:EleutherAI/pythia-70m@v1.0")


def test_lens_on_a_cached_hub_model(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    _cache(tmp_path, "EleutherAI/pythia-70m", _pythia_shaped())
    assert main(["lens", "hf:EleutherAI/pythia-70m", "--prompt", "the cat sat on the", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)["logit lens"]
    assert r["ids"] == [1, 2, 3, 4, 1]  # read with the snapshot's tokenizer.json
    assert [row["after"] for row in r["layers"]] == ["embed", "block 0", "block 1"]  # the embeddings and 2 blocks
    assert max(r["layers"][-1]["kl"]) < 1e-5  # the last layer is the model's own output
    assert main(["lens", "hf:EleutherAI/pythia-70m", "--prompt", "the cat sat on the"]) == 0
    assert "block 1" in capsys.readouterr().out


def test_uncached_hub_model_offline_is_one_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert main(["lens", "hf:EleutherAI/pythia-70m", "--prompt", "the cat"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "hf:EleutherAI/pythia-70m is not in the Hugging Face cache" in err
    assert str(tmp_path / "hub") in err and "HF_HUB_OFFLINE=1" in err and "hf download EleutherAI/pythia-70m" in err
    with pytest.raises(UserError, match="give hf:ORG/NAME"):
        load("hf:pythia-70m")


def test_count_and_generate_take_a_hub_spec_like_every_command(tmp_path, monkeypatch, capsys):
    """One resolver for every command: `lumen count hf:...` reads the cached config (no weights), and the
    snapshot's generation_config.json is the loaded model's sampling default, for Python callers too."""
    from lumen.decode import Sampling

    monkeypatch.setenv("HF_HOME", str(tmp_path))
    hf = _pythia_shaped()
    snapshot = _cache(tmp_path, "EleutherAI/pythia-70m", hf)
    assert main(["count", "hf:EleutherAI/pythia-70m", "--json"]) == 0
    counted = json.loads(capsys.readouterr().out)
    assert counted["exact"]["total"] == sum(p.numel() for p in hf.parameters())
    (snapshot / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.7}))
    model = load("hf:EleutherAI/pythia-70m").model
    assert model.sampling == Sampling(temperature=0.7)
    assert main(["generate", "hf:EleutherAI/pythia-70m", "--prompt", "the cat", "--max-new-tokens", "2",
                 "--seed", "1"]) == 0
    assert "temperature 0.7" in capsys.readouterr().err
