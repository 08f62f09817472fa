"""Training a sparse autoencoder (lumen.features.train): a run stopped at any step resumes to the same weights as
one never stopped, bit for bit; the dictionary written is a SAELens folder that `lumen features` reads; the
recipe's pieces against their definitions computed another way (the geometric median against a brute-force
search, the sparse TopK decoding against the dense one, AuxK against its formula, the scale folded into the
dictionary exactly); and training lowers the held-out FVU of a tiny model's stream at L0 = k."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers.runs import tiny_run
from lumen.errors import TrainingError, UserError
from lumen.features import read_saelens
from lumen.features.train import FINAL, SAETrainConfig, SAETrainer, fvu, geometric_median
from lumen.formats import load

SITE = "blocks.1.resid_post"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tiny_run(tmp_path_factory.mktemp("tiny"))
    loaded = load(root / "run")
    return root, loaded.model, loaded.tokenizer


def config(root: Path, **changes) -> SAETrainConfig:
    """A run of 24 steps over 3 buffers of 128 activations (each used twice, 8 steps a buffer), evaluated every 5
    steps."""
    base = dict(site=SITE, k=4, width=4, tokens=384, batch=32, buffer_tokens=128, reuse=2, seq_len=32,
                corpus=str(root / "corpus"), eval_tokens=128, eval_interval=5, log_interval=2, warmup=2,
                dead_after=64)
    return SAETrainConfig(**{**base, **changes})


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "sae_weights.safetensors"))


def test_a_run_stopped_at_any_step_resumes_to_the_same_weights_bit_for_bit(tiny, tmp_path):
    root, model, tok = tiny
    cfg = config(root)
    whole = SAETrainer(model, tok, cfg, tmp_path / "whole", talks=False)
    whole.run()
    assert whole.step == cfg.steps == 24

    class Killed(Exception):
        pass

    class DiesAtStep13(SAETrainer):   # as a kill -9 would: in the middle of a buffer, steps after a checkpoint
        def train_step(self) -> dict:
            if self.step == 13:
                raise Killed
            return super().train_step()

    with pytest.raises(Killed):
        DiesAtStep13(model, tok, cfg, tmp_path / "broken", talks=False).run()
    kept = sorted(p.name for p in (tmp_path / "broken" / "checkpoints").iterdir())
    assert kept == ["step-000005", "step-000010"]      # steps 11 and 12 are lost, to be taken again
    resumed = SAETrainer(model, tok, cfg, tmp_path / "broken", talks=False)
    resumed.run(resume=True)
    a, b = weights(tmp_path / "whole" / FINAL), weights(tmp_path / "broken" / FINAL)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the records of the resumed run are the uninterrupted run's (the steps lost and taken again appear once)
    lines = [json.loads(line) for line in (tmp_path / "broken" / "metrics.jsonl").read_text().splitlines()]
    again = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    strip = ("time", "model_s", "sae_s")
    assert [r["step"] for r in lines if "loss" in r][-3:] == [20, 22, 24]
    assert [{k: v for k, v in r.items() if k not in strip} for r in lines if r["step"] > 10] == \
           [{k: v for k, v in r.items() if k not in strip} for r in again if r["step"] > 10]


def test_resuming_with_other_settings_is_refused(tiny, tmp_path):
    root, model, tok = tiny
    SAETrainer(model, tok, config(root, tokens=320), tmp_path / "run", talks=False).run()
    with pytest.raises(UserError, match="other settings.*k = 4 \\(now: 3\\)"):
        SAETrainer(model, tok, config(root, tokens=320, k=3), tmp_path / "run", talks=False).run(resume=True)
    with pytest.raises(UserError, match="already holds checkpoints"):
        SAETrainer(model, tok, config(root, tokens=320), tmp_path / "run", talks=False).run()


def test_training_lowers_the_held_out_fvu_at_l0_k_with_unit_decoder_rows(tiny, tmp_path):
    root, model, tok = tiny
    cfg = config(root, tokens=768, lr=3e-3)
    untrained = SAETrainer(model, tok, cfg, None, talks=False)
    untrained.start_fresh()    # b_dec at the geometric median, the encoder the decoder's transpose
    before = untrained.evaluate()["val_loss"]
    trainer = SAETrainer(model, tok, cfg, tmp_path / "run", talks=False)
    sae = trainer.run()
    evals = [r for r in trainer.history if "val_loss" in r]
    assert evals[-1]["val_loss"] < 0.75 * before
    assert all(r["val_l0"] <= 4 for r in evals)
    torch.testing.assert_close(sae.W_dec.norm(dim=-1), torch.ones(sae.d_sae))
    # the written dictionary reads the model's own activations: what the trainer measured at the scale it trains at
    x = trainer.heldout
    assert x is not None
    with torch.no_grad():
        assert float(fvu(x, sae(x))) == pytest.approx(evals[-1]["val_loss"], rel=1e-4)


def test_the_scale_is_folded_into_the_dictionary_exactly(tiny):
    root, model, tok = tiny
    trainer = SAETrainer(model, tok, config(root), None, talks=False)
    trainer.scale = 0.25
    with torch.no_grad():
        for p in trainer.sae.parameters():
            p.normal_()
    x = torch.randn(7, trainer.sae.d_in)
    sae = trainer.dictionary()
    # f(x) = scale x f_trained(x / scale), and its reconstruction is scale x the trained one's
    torch.testing.assert_close(sae.encode(x), 0.25 * trainer.sae.encode(x / 0.25))
    torch.testing.assert_close(sae(x), 0.25 * trainer.sae(x / 0.25))


def test_the_geometric_median_minimises_the_summed_distance():
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(50, 3, generator=g), 100 + torch.randn(5, 3, generator=g)])   # a few far outliers
    m = geometric_median(x, iterations=200)

    def cost(p: torch.Tensor) -> float:
        return float((x - p).norm(dim=-1).sum())

    steps = 0.01 * torch.randn(200, 3, generator=g)
    assert all(cost(m) <= cost(m + s) + 1e-4 for s in steps)
    assert m.norm() < 5 < x.mean(0).norm()   # the outliers pull the mean, not the median


def test_the_sparse_topk_decoding_and_auxk_are_their_formulas(tiny):
    root, model, tok = tiny
    trainer = SAETrainer(model, tok, config(root, aux_k=3), None, talks=False)
    sae = trainer.sae
    with torch.no_grad():
        sae.b_enc.normal_()
        sae.b_dec.normal_()
    x = torch.randn(9, sae.d_in, generator=torch.Generator().manual_seed(1))
    dead = torch.zeros(sae.d_sae, dtype=torch.bool)
    dead[::3] = True
    trainer.since_fired = torch.where(dead, 10**6, 0)
    parts = trainer.losses(x)
    x_hat = sae(x)   # the dense decoding, through the SAE's own TopK
    assert float(parts["mse"]) == pytest.approx(float(((x - x_hat) ** 2).sum() / ((x - x.mean(0)) ** 2).sum()),
                                                rel=1e-5)
    # AuxK by hand, in float64 and loops: each token's 3 largest pre-activations among the dead latents
    pre = sae.pre(x).double()
    e = (x - x_hat).double()
    W = sae.W_dec.double()
    e_hat = torch.zeros_like(e)
    for n in range(x.size(0)):
        cand = sorted(((float(pre[n, j]), j) for j in range(sae.d_sae) if dead[j]), reverse=True)[:3]
        for value, j in cand:
            e_hat[n] += max(value, 0.0) * W[j]
    want = ((e - e_hat) ** 2).sum() / ((e - e.mean(0)) ** 2).sum() / 32
    assert float(parts["aux"]) == pytest.approx(float(want), rel=1e-4)


def test_the_command_trains_a_dictionary_that_lumen_features_reads(tiny, tmp_path, capsys, monkeypatch):
    from lumen.cli import main
    from lumen.runtime import cpu

    monkeypatch.setenv(cpu.OVERRIDE, "avx avx2 fma")  # a CPU without bf16 arithmetic: --dtype auto reads in float32

    root, _, _ = tiny

    def lumen(*args: str) -> tuple[int, str, str]:
        code = main(["features", *args])
        out, err = capsys.readouterr()
        return code, out, err

    common = ["--corpus", str(root / "corpus"), "--seq-len", "32", "-q"]
    code, out, err = lumen("train", str(root / "run"), "--site", SITE, "--k", "4", "--width", "4x", "--tokens", "256",
                           "--batch", "32", "--buffer-tokens", "64", "--eval-interval", "4", "--eval-tokens", "64",
                           "--report-windows", "2", "--out", str(tmp_path / "out"), "--json", *common)
    assert code == 0, err
    report = json.loads(out)
    assert report["dtype"] == "float32"
    assert report["steps"] == 8 and report["l0"] <= 4 and 0 < report["fvu"] and report["site"] == SITE
    cfg = json.loads((tmp_path / "out" / FINAL / "cfg.json").read_text())
    assert cfg["architecture"] == "topk" and cfg["k"] == 4 and cfg["d_sae"] == 128
    assert cfg["metadata"]["hook_name"] == "blocks.1.hook_resid_post" and cfg["metadata"]["lumen_skip_first"] == 1
    assert read_saelens(tmp_path / "out" / FINAL).site == SITE
    # measured again by `lumen features`, which leaves out the first position as cfg.json records: 2 windows of 31
    code, out, err = lumen(str(root / "run"), "--sae", str(tmp_path / "out" / FINAL), "--windows", "2", "--json",
                           *common)
    assert code == 0, err
    again = json.loads(out)
    assert again["l0"] <= 4 and again["tokens"] == 2 * 31
    code, out, err = lumen(str(root / "run"), "--sae", str(tmp_path / "out" / FINAL), "--windows", "2",
                           "--skip-first", "0", "--json", *common)
    assert code == 0 and json.loads(out)["tokens"] == 2 * 32, err
    # bad input: one line, exit 2
    for bad, said in ((["--site", "blocks.9.resid_post"], "--site blocks.9.resid_post"),
                      (["--site", SITE, "--width", "x8"], "--width"), (["--site", SITE, "--k", "0"], "--k")):
        code, out, err = lumen("train", str(root / "run"), *bad, "--out", str(tmp_path / "bad"), *common)
        assert code == 2 and said in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err


def test_a_diverging_run_stops_with_one_line(tiny, tmp_path):
    root, model, tok = tiny
    trainer = SAETrainer(model, tok, config(root), None, talks=False)
    trainer.start_fresh()
    trainer.buffer[:] = float("nan")
    with pytest.raises(TrainingError, match="became nan"):
        trainer.train_step()


@pytest.mark.slow
def test_a_run_killed_with_sigkill_resumes_to_the_same_weights(tiny, tmp_path):
    """The command itself, killed with kill -9 once its first checkpoint is on disk, then resumed."""
    import os
    import signal
    import subprocess
    import sys
    import time

    root, _, _ = tiny
    env = {**os.environ, "LUMEN_OFFLINE": "1", "OMP_NUM_THREADS": "1"}

    def command(out: Path, *more: str) -> list[str]:
        return [sys.executable, "-m", "lumen", "features", "train", str(root / "run"), "--site", SITE, "--k", "4",
                "--width", "4x", "--tokens", "2048", "--batch", "32", "--buffer-tokens", "128", "--eval-interval",
                "3", "--eval-tokens", "64", "--report-windows", "2", "--dtype", "float32", "--corpus",
                str(root / "corpus"), "--seq-len", "32", "-q", "--out", str(out), *more]

    whole = subprocess.run(command(tmp_path / "whole"), env=env, capture_output=True, text=True, timeout=600)
    assert whole.returncode == 0, whole.stderr
    proc = subprocess.Popen(command(tmp_path / "killed"), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    checkpoints = tmp_path / "killed" / "checkpoints"
    deadline = time.time() + 300
    while time.time() < deadline and not (checkpoints.is_dir() and any(checkpoints.iterdir())):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "killed" / FINAL).exists()    # killed before the end
    again = subprocess.run(command(tmp_path / "killed", "--resume"), env=env, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stderr
    a, b = weights(tmp_path / "whole" / FINAL), weights(tmp_path / "killed" / FINAL)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_fvu_without_massive_activations_is_its_formula(tiny):
    """A token whose embedding is made 1000x larger carries a massive stream: quality's fvu_typical leaves its
    positions out (a norm >= 10x the median), computed here again from the site's activations."""
    import copy

    from lumen.features.quality import quality
    from lumen.features.train import SAE, TopK
    from lumen.inspect import run_with_cache

    _, model, _ = tiny
    model = copy.deepcopy(model)
    with torch.no_grad():
        model.tok_emb.weight[5] *= 1000
    torch.manual_seed(0)
    sae = SAE(model.cfg.d_model, 64, TopK(4), site=SITE)
    windows = torch.randint(0, model.cfg.vocab_size, (4, 16), generator=torch.Generator().manual_seed(2))
    windows[1, 7] = windows[2, 3] = 5
    q = quality(model, sae, windows, batch=4, skip=1)
    x = run_with_cache(model, windows, names=[SITE])[1][SITE][:, 1:].flatten(0, 1).double()
    x_hat = sae(x.float()).double()
    norms = x.norm(dim=-1)
    typical = norms < 10 * norms.median()
    xt, et = x[typical], (x - x_hat)[typical]
    assert q.massive == int((~typical).sum()) == int((windows[:, 1:] == 5).sum()) >= 2
    assert q.fvu_typical == pytest.approx(float(et.pow(2).sum() / (xt - xt.mean(0)).pow(2).sum()), rel=1e-4)
    assert q.fvu == pytest.approx(float((x - x_hat).pow(2).sum() / (x - x.mean(0)).pow(2).sum()), rel=1e-4)
