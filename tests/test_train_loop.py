"""The training loop in-process with a tiny model: it learns, it is deterministic, gradient accumulation is
a bigger batch, checkpoints are model specs, and NaNs and full disks lose nothing."""

from __future__ import annotations

import errno
import json
import math

import pytest
import torch
from safetensors.torch import load_file

from lumen import GPT
from lumen.data import prepare
from lumen.formats import checkpoint as ckpt
from lumen.formats import load
from lumen.runtime import cpu
from lumen.train import TrainingError, load_config, train
from lumen.train.loop import training_attention


@pytest.fixture(scope="module")
def data():
    return prepare("shakespeare", "char")


def tiny(tmp_path=None, *sets: str):
    extra = [f"out_dir={tmp_path}"] if tmp_path else ["save=false"]
    return load_config(preset="tiny", sets=["progress=false", *extra, *sets])


@pytest.fixture(scope="module")
def run(tmp_path_factory, data):
    out = tmp_path_factory.mktemp("run")
    cfg, m = tiny(out, "steps=40", "keep_last=1")
    return train(cfg, m, data=data)


def test_it_learns_and_records(run, data):
    history = [r for r in run.history if "loss" in r]
    # at initialisation every character is about equally likely: the loss is ln(vocab)
    assert history[0]["loss"] == pytest.approx(math.log(data.tokenizer.vocab_size), abs=0.15)
    assert run.final_val_loss < history[0]["loss"] - 0.7
    assert run.steps == 40 and run.tokens == 40 * 4 * 32 and run.tokens_per_s > 0 and 0 < run.mfu < 1
    assert [e["step"] for e in run.evals] == [10, 20, 30, 40] and "sample" in run.evals[-1]
    assert run.best_val_loss == min(e["val_loss"] for e in run.evals)
    lines = (run.run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == json.loads(json.dumps(run.history))
    assert (run.run_dir / "loss.png").read_bytes()[:4] == b"\x89PNG"
    summary = json.loads((run.run_dir / "summary.json").read_text())
    assert summary["final_val_loss"] == run.final_val_loss and summary["steps"] == 40
    # keep_last=1 keeps the newest and the best
    best = json.loads((run.run_dir / "best.json").read_text())["checkpoint"]
    assert {p.name for p in ckpt.checkpoints(run.run_dir)} == {"step-000040", best}


def test_a_run_is_a_model_spec(run):
    loaded = load(run.run_dir)
    model, tok = loaded.model, loaded.tokenizer
    best = ckpt.best_checkpoint(run.run_dir)
    assert ckpt.resolve(run.run_dir) == best
    x = torch.tensor([tok.encode("ROMEO:\nBut soft")])
    stored = GPT(model.cfg)  # the file read by torch's own loader (the tied unembedding follows the embedding)
    missing, unexpected = stored.load_state_dict(load_file(str(best / ckpt.WEIGHTS)), strict=False)
    assert missing == ["lm_head.weight"] and not unexpected
    assert torch.equal(model(x)[0], stored.eval()(x)[0])
    final = load(run.run_dir / "checkpoints" / "step-000040").model
    assert torch.equal(final(x)[0], run.model(x)[0])  # the checkpoint holds exactly the trained weights
    weights = load_file(str(best / ckpt.WEIGHTS))
    assert "lm_head.weight" not in weights and "tok_emb.weight" in weights  # the tied matrix, stored once
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in weights)
    assert final.lm_head.weight is final.tok_emb.weight
    assert tok.decode(tok.encode("To be")) == "To be"


def test_compiled_and_ddp_wrappers_save_plain_names():
    model = GPT.from_preset("baby-gpt", n_layers=1, d_model=32, n_heads=2, vocab_size=20, context=16)
    compiled = torch.compile(model)  # nothing is compiled until it runs; the wrapper's names are what matter
    assert all(k.startswith("_orig_mod.") for k in compiled.state_dict())
    assert list(ckpt.model_state(compiled)) == list(ckpt.model_state(model))
    assert "lm_head.weight" not in ckpt.model_state(model)


def test_deterministic_and_accumulation_is_a_bigger_batch(data):
    """Same seed, same bits; 2 micro-batches of 4 take the same steps as one batch of 8 (fp32)."""
    a = train(*tiny(None, "steps=8", "batch_size=8", "dtype=float32", "sample_tokens=0"), data=data)
    b = train(*tiny(None, "steps=8", "batch_size=8", "dtype=float32", "sample_tokens=0"), data=data)
    c = train(*tiny(None, "steps=8", "batch_size=4", "grad_accum=2", "dtype=float32", "sample_tokens=0"), data=data)
    for (ka, va), (kb, vb), (_, vc) in zip(a.model.state_dict().items(), b.model.state_dict().items(),
                                           c.model.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
        torch.testing.assert_close(vc, va, rtol=0, atol=1e-5)
    la, lc = ([r["loss"] for r in x.history if "loss" in r] for x in (a, c))
    assert la == pytest.approx(lc, abs=1e-5)


def test_compiled_bf16_training_takes_the_eager_steps(data, cpp_compiler):
    """Compiled (lumen's compile options; on CPU in bf16 the plain attention path), a run takes the steps of
    the eager one, to bf16 rounding, and gives the model back with its own attention choice."""
    runs = [train(*tiny(None, "steps=6", "dtype=bfloat16", "sample_tokens=0", f"compile={c}"), data=data)
            for c in ("false", "true")]
    eager, compiled = ([r["loss"] for r in run.history if "loss" in r] for run in runs)
    assert compiled == pytest.approx(eager, abs=1e-3)  # measured: within 1e-4; a wrong mask: 4e-3 by step 2
    assert all(b.attn.use_sdpa for b in runs[1].model.blocks)


def test_a_compiled_run_repeats_bit_for_bit(data, cpp_compiler):
    """Compiled with two threads, the same seed gives the same weights: the embedding's gradient is summed in
    a fixed order (deterministic mode, which the run turns off again at its end)."""
    a, b = (train(*tiny(None, "steps=20", "threads=2", "compile=true", "sample_tokens=0"), data=data).model
            for _ in range(2))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.are_deterministic_algorithms_enabled()


def test_a_run_that_cannot_start_leaves_the_process_as_it_was(data, cpp_compiler):
    """A run sets torch's threads (tiny: 1) and, compiled, deterministic mode; a failed start undoes both."""
    threads = torch.get_num_threads()
    with pytest.raises(ValueError, match="fewer than one context window"):
        train(*tiny(None, "compile=true", "model.context=1000000"), data=data)
    assert torch.get_num_threads() == threads and not torch.are_deterministic_algorithms_enabled()


def test_compiling_without_a_cpp_compiler_is_one_clear_error(data, monkeypatch):
    from torch._inductor import cpp_builder, exc

    def none_found() -> str:
        raise exc.InvalidCxxCompiler()

    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", none_found)
    with pytest.raises(ValueError, match="needs a C.. compiler .* or set compile=false"):
        train(*tiny(None, "compile=true"), data=data)


def test_training_attention_is_plain_only_where_it_pays():
    """Compiled, bf16, on CPU, and attention weights no bigger than the MLP's activations (h T <= d_ff)."""
    def plain(model: GPT, compiled: bool = True, bf16: bool = True) -> list[bool]:
        with training_attention(model, compiled, bf16):
            return [not b.attn.use_sdpa for b in model.blocks]

    short = GPT.from_preset("baby-gpt", n_layers=2, d_model=64, n_heads=4, vocab_size=20, context=64)  # 256 <= 256
    long = GPT.from_preset("baby-gpt", n_layers=2, d_model=64, n_heads=4, vocab_size=20, context=128)
    assert plain(short) == [True, True]
    assert plain(short, compiled=False) == plain(short, bf16=False) == plain(long) == [False, False]
    assert all(b.attn.use_sdpa for b in short.blocks)  # restored: the model's own choice again


def test_bf16_run_samples_through_the_kv_cache(data):
    """A sample short enough for the context decodes with the KV cache, under bf16 autocast."""
    cfg, m = tiny(None, "steps=2", "eval_interval=2", "dtype=bfloat16", "sample_tokens=8", "sample_prompt='ROMEO:'")
    r = train(cfg, m, data=data)
    (sample,) = [rec["sample"] for rec in r.history if "sample" in rec]
    assert sample.startswith("ROMEO:") and len(sample) == len("ROMEO:") + 8  # char tokenizer: one char a token


@pytest.mark.parametrize("flags", ["avx avx2 fma", "avx2 avx512f avx512bw avx512vl avx512dq avx512_bf16"])
def test_bf16_asked_for_without_bf16_arithmetic_says_so(data, flags, monkeypatch, capsys):
    """bf16 on a CPU without bf16 instructions (an AVX2-only x86, or an AVX-512 one before AVX512-BF16) runs every
    product converted in software, far slower than fp32: the run says so where it says bf16, and "auto" trains
    in fp32 there; on a CPU with them it says nothing of it."""
    monkeypatch.setenv(cpu.OVERRIDE, flags)
    native = "avx512_bf16" in flags
    onednn = not torch.backends.mkldnn.is_available() or torch.ops.mkldnn._is_mkldnn_bf16_supported()  # (CPUID's say)
    for dtype in ("bfloat16", "auto"):
        cfg, m = tiny(None, "steps=1", "progress=true", "eval_interval=1000", "sample_tokens=0", f"dtype={dtype}")
        train(cfg, m, data=data)
        said = capsys.readouterr().err
        warned = "this CPU has no bf16 arithmetic" in said
        assert warned == (dtype == "bfloat16" and not native), said
        assert ("bf16 autocast on cpu" in said) == (dtype == "bfloat16" or native and onednn)


def test_dropout_and_other_model_choices_reach_the_model(data):
    cfg, m = tiny(None, "steps=2", "sample_tokens=0", "model.dropout=0.1", "model.norm_placement=post")
    r = train(cfg, m, data=data)
    assert r.model.cfg.dropout == 0.1 and type(r.model.blocks[0]).__name__ == "PostLNBlock"
    assert r.model.cfg.vocab_size == data.tokenizer.vocab_size


class Poisoned(GPT):
    """A model whose loss turns to NaN from its `after`-th forward pass in training."""

    after = 10**9

    def forward(self, idx, targets=None, **kw):
        logits, loss = super().forward(idx, targets, **kw)
        if self.training and targets is not None:
            self.calls = getattr(self, "calls", 0) + 1
            if self.calls > self.after:
                loss = loss * float("nan")
        return logits, loss


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, data):
    cfg, m = tiny(tmp_path, "steps=20", "eval_interval=5", "sample_tokens=0")
    model = Poisoned(m.replace(vocab_size=data.tokenizer.vocab_size))
    model.after = 12
    with pytest.raises(TrainingError, match=r"loss became nan at step 13.*last good checkpoint is .*step-000010"):
        train(cfg, model=model, data=data)
    kept = ckpt.checkpoints(tmp_path)
    assert [p.name for p in kept] == ["step-000005", "step-000010"]
    good = load(kept[-1]).model
    assert all(torch.isfinite(p).all() for p in good.parameters())


def test_full_disk_leaves_the_previous_checkpoint_intact(tmp_path, data, monkeypatch):
    import safetensors.torch

    real = safetensors.torch.save_file
    calls = []

    def fill_the_disk(tensors, filename, metadata=None):
        calls.append(filename)
        if len(calls) == 2:  # the second checkpoint: half the file, then the disk is full
            with open(filename, "wb") as f:
                f.write(b"\0" * 1000)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", fill_the_disk)
    cfg, m = tiny(tmp_path, "steps=20", "eval_interval=5", "sample_tokens=0")
    with pytest.raises(TrainingError, match=r"could not save checkpoint step-000010 \(No space left on device\); "
                                            r"the previous checkpoints are intact \(step-000005\)"):
        train(cfg, m, data=data)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-000005"]  # no partial directory
    model = load(tmp_path).model
    assert model.cfg.n_layers == 1
    state = ckpt.load_trainer_state(tmp_path / "checkpoints" / "step-000005")
    assert state["step"] == 5


def test_refuses_to_overwrite_a_run(tmp_path, data):
    cfg, m = tiny(tmp_path, "steps=5", "eval_interval=5", "sample_tokens=0")
    train(cfg, m, data=data)
    with pytest.raises(ValueError, match="already holds checkpoints .* --resume"):
        train(cfg, m, data=data)
    with pytest.raises(ValueError, match="another model config"):
        train(cfg, m.replace(n_layers=2), data=data, resume=True)
    with pytest.raises(FileNotFoundError, match="neither a lumen checkpoint"):
        load(tmp_path / "checkpoints")


def test_a_muon_run_resumes_bit_for_bit_and_keeps_its_clock(tmp_path, data):
    """optimizer = "muon": a run resumed from its step-6 checkpoint ends with the weights of the run left alone
    (the momentum buffers and both optimizers' state restored), and its evaluations' clock counts on."""
    import shutil

    sets = ("steps=12", "optimizer=muon", "eval_interval=3", "dtype=float32", "sample_tokens=0", "keep_last=4")
    alone = train(*tiny(tmp_path / "alone", *sets), data=data)
    shutil.copytree(tmp_path / "alone", tmp_path / "again")
    for step in (9, 12):
        shutil.rmtree(tmp_path / "again" / "checkpoints" / f"step-{step:06d}")
    (tmp_path / "again" / "best.json").unlink()
    again = train(*tiny(tmp_path / "again", *sets), data=data, resume=True)
    for (k, a), (_, b) in zip(alone.model.state_dict().items(), again.model.state_dict().items()):
        assert torch.equal(a, b), k
    clock = [r["time"] for r in again.evals]
    assert [r["step"] for r in again.evals] == [3, 6, 9, 12] and clock == sorted(clock) and clock[0] > 0
