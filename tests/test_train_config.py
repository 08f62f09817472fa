"""Training configs: TOML files, presets, --set overrides, and errors that list what is valid."""

from __future__ import annotations

import pytest

from lumen.cli import main
from lumen.config import ModelConfig
from lumen.train import PRESETS, TrainConfig, load_config, to_toml
from lumen.train.optim import lr_at, param_groups


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_is_a_valid_config(name):
    cfg, model_cfg = load_config(preset=name)
    assert isinstance(cfg, TrainConfig) and isinstance(model_cfg, ModelConfig)
    assert cfg.steps > cfg.warmup and cfg.min_lr <= cfg.lr


def test_toml_file_and_sets(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('corpus = ["a.txt", "b.txt"]\nsteps = 50\nlr = 1e-3\n\n'
                    '[model]\npreset = "baby-llama"\nn_layers = 2\n')
    cfg, m = load_config(path, sets=["lr=3e-4", "compile=true", "validation=['hamlet']", "model.dropout=0.1",
                                     "out_dir=runs/x=y", "sample_prompt=ROMEO:"])
    assert cfg.corpus == ["a.txt", "b.txt"] and cfg.steps == 50 and cfg.lr == 3e-4 and cfg.compile is True
    assert cfg.validation == ["hamlet"] and cfg.out_dir == "runs/x=y" and cfg.sample_prompt == "ROMEO:"
    assert m == ModelConfig.from_name("baby-llama").replace(n_layers=2, dropout=0.1)


def test_whole_numbers_given_for_floats_are_floats():
    """`--set beta2=0` (TOML's integer 0) is the float 0.0 the config declares: torch's AdamW refuses an int
    beta beside a float one, which reached the user as a raw ValueError."""
    import torch

    cfg, _ = load_config(preset="tiny", sets=["beta2=0", "beta1=0", "lr=1", "weight_decay=0", "steps=3"])
    assert [type(v) for v in (cfg.beta1, cfg.beta2, cfg.lr, cfg.weight_decay, cfg.steps)] == [float] * 4 + [int]
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=cfg.lr, betas=(0.9, cfg.beta2))


def test_to_toml_round_trips(tmp_path):
    cfg, m = load_config(preset="shakespeare", sets=["sample_prompt=\"quote \\\" and\\nnewline\""])
    path = tmp_path / "again.toml"
    path.write_text(to_toml(cfg, m))
    assert load_config(path) == (cfg, m)


@pytest.mark.parametrize("preset", ["gemma3-1b", "smollm3-3b", "llama3.2-1b", "qwen3-30b-a3b"])
def test_to_toml_round_trips_every_kind_of_model_field(tmp_path, preset):
    """Per-layer patterns (tuples), RoPE scaling (a table) and experts survive a TOML file: --print-config's
    output of a model with each is read back to the same config (a tuple field raised a TypeError before)."""
    cfg, _ = load_config(preset="shakespeare")
    model = ModelConfig.from_name(preset)
    path = tmp_path / "m.toml"
    path.write_text(to_toml(cfg, model))
    assert load_config(path)[1] == model.replace(vocab_size=load_config(path)[1].vocab_size)


def test_unknown_keys_list_the_valid_ones(tmp_path):
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['stepz'\]; valid keys: corpus, tokenizer.*steps"):
        load_config(preset="tiny", sets=["stepz=3"])
    with pytest.raises(ValueError, match=r"unknown \[model\] key\(s\) \['layers'\]; valid: preset, vocab_size"):
        load_config(preset="tiny", sets=["model.layers=3"])
    with pytest.raises(ValueError, match="unknown training preset 'shakespear'; choose one of: shakespeare"):
        load_config(preset="shakespear")


def test_wrong_types_name_the_expected_type(tmp_path):
    with pytest.raises(ValueError, match="steps must be int, got 'many'"):
        load_config(preset="tiny", sets=["steps=many"])
    with pytest.raises(ValueError, match="lr must be float, got True"):
        load_config(preset="tiny", sets=["lr=true"])
    with pytest.raises(ValueError, match="model.n_layers must be int, got 2.5"):
        load_config(preset="tiny", sets=["model.n_layers=2.5"])
    with pytest.raises(ValueError, match="min_lr .* must not exceed lr"):
        load_config(preset="tiny", sets=["min_lr=1.0"])
    path = tmp_path / "bad.toml"
    path.write_text("steps = = 3\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_config(path)


def test_cli_prints_one_line_errors(tmp_path, capsys):
    assert main(["train", "--preset", "tiny", "--set", "stepz=3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lumen train: error: preset tiny: unknown key(s) ['stepz']") and "\n" not in err
    assert main(["train", str(tmp_path / "missing.toml")]) == 2
    assert "no config file" in capsys.readouterr().err
    assert main(["train", "--preset", "tiny", "--print-config"]) == 0
    assert "[model]" in capsys.readouterr().out


def test_lr_schedule_matches_torch_schedulers():
    """Warm-up is linear; after it the rate follows torch's own CosineAnnealingLR to min_lr."""
    import torch

    lr, min_lr, warmup, steps = 1e-2, 1e-3, 10, 110
    ours = [lr_at(s, lr, min_lr, warmup, steps) for s in range(steps)]
    assert ours[:warmup] == pytest.approx([lr * (s + 1) / (warmup + 1) for s in range(warmup)])
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps - 1 - warmup, eta_min=min_lr)
    reference = []
    for _ in range(warmup, steps):
        reference.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert ours[warmup:] == pytest.approx(reference, rel=1e-9)
    assert ours[-1] == pytest.approx(min_lr) and max(ours) == pytest.approx(lr)


def test_weight_decay_on_matrices_only():
    from lumen import GPT

    model = GPT(ModelConfig.from_name("baby-gpt").replace(n_layers=1, d_model=32, n_heads=2, vocab_size=50))
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in decay["params"]} == {n for n, p in model.named_parameters() if p.dim() == 2}
    assert all(names[id(p)].endswith((".b", ".g", ".bias")) for p in no_decay["params"])
    assert no_decay["weight_decay"] == 0.0 and decay["weight_decay"] == 0.1
    n = sum(p.numel() for g in (decay, no_decay) for p in g["params"])
    assert n == sum(p.numel() for p in model.parameters())  # the tied unembedding counted once


def test_the_training_bar_draws_on_a_terminal_only(tmp_path, monkeypatch):
    """Piped into a log, `lumen train` writes its banner, evaluation lines and summary, with no bar redraws
    (carriage returns); on a terminal the bar shows the steps."""
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for stream in (io.StringIO(), Terminal()):
        monkeypatch.setattr(sys, "stderr", stream)
        assert main(["train", "--preset", "tiny", "--set", "steps=4", "--set", "eval_interval=2",
                     "--set", "sample_tokens=0", "--set", f"out_dir={tmp_path / type(stream).__name__}"]) == 0
        err = stream.getvalue()
        assert "step 4: val loss" in err
        assert ("\r" in err and "4/4" in err) == isinstance(stream, Terminal), err
