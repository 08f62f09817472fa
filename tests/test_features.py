"""Sparse dictionaries (lumen.features): each architecture's encode/decode against its formula written another way
(numpy, float64, loops where the formula is a selection); SAELens's directory format read and written, bad files
one clear error; splicing through hooks checked against the model itself: a dictionary built by hand from the
stream's own basis reconstructs it exactly, a transcoder built from a ReLU MLP's weights is that MLP, and the error
term gives the model's own logits back."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from helpers.features import basis_dictionary
from lumen import GPT, ModelConfig
from lumen.errors import ModelFileError, UserError
from lumen.features import (
    SAE,
    BatchTopK,
    JumpReLU,
    ReLU,
    TopK,
    Transcoder,
    hook_from_site,
    read_saelens,
    save_saelens,
    site_from_hook,
    spliced,
)
from lumen.inspect import replace_activation, run_with_cache
from lumen.tokenizers import pad


def random_sae(act: torch.nn.Module, d_in: int = 8, d_sae: int = 24, seed: int = 0, **kw) -> SAE:
    torch.manual_seed(seed)
    sae = SAE(d_in, d_sae, act, site="blocks.1.resid_post", **kw)
    with torch.no_grad():
        for p in sae.parameters():
            p.normal_()
    return sae


def numpy_pre(sae: SAE, x: np.ndarray) -> np.ndarray:
    W_enc, b_enc, b_dec = (t.detach().double().numpy() for t in (sae.W_enc, sae.b_enc, sae.b_dec))
    x = x - b_dec if sae.apply_b_dec_to_input else x
    return np.einsum("ni,ij->nj", x, W_enc) + b_enc


def numpy_decode(sae: SAE, f: np.ndarray) -> np.ndarray:
    return np.einsum("nj,jo->no", f, sae.W_dec.detach().double().numpy()) + sae.b_dec.detach().double().numpy()


def assert_near(got: torch.Tensor, want: np.ndarray, tol: float = 1e-4) -> None:
    np.testing.assert_allclose(got.detach().double().numpy(), want, rtol=tol, atol=tol)


X = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))


def test_relu_dictionary_is_its_formula():
    sae = random_sae(ReLU())
    pre = numpy_pre(sae, X.double().numpy())
    want = np.maximum(pre, 0)
    assert_near(sae.encode(X), want)
    assert_near(sae(X), numpy_decode(sae, want))


def test_topk_keeps_each_tokens_k_largest_positive_preactivations():
    sae = random_sae(TopK(3))
    pre = numpy_pre(sae, X.double().numpy())
    want = np.zeros_like(pre)
    for n, row in enumerate(pre):  # by sorting, one token at a time
        for j in sorted(range(len(row)), key=lambda j: -row[j])[:3]:
            want[n, j] = max(row[j], 0.0)
    assert_near(sae.encode(X), want)
    assert int((sae.encode(X) != 0).sum(-1).max()) <= 3


def test_batch_topk_keeps_k_per_token_on_average_over_the_batch():
    sae = random_sae(BatchTopK(3))
    pre = np.maximum(numpy_pre(sae, X.double().numpy()), 0)
    cut = np.sort(pre.ravel())[::-1][3 * len(pre) - 1]  # the 15th largest of the batch's 5 x 24
    want = np.where(pre >= cut, pre, 0)
    assert_near(sae.encode(X), want)
    assert (sae.encode(X) != 0).sum() == 15 and len(set((sae.encode(X) != 0).sum(-1).tolist())) > 1


def test_jumprelu_passes_a_whole_preactivation_above_its_own_threshold():
    sae = random_sae(JumpReLU(24))
    with torch.no_grad():
        sae.act.threshold.copy_(torch.linspace(-1, 2, 24))
    pre = numpy_pre(sae, X.double().numpy())
    theta = np.linspace(-1, 2, 24)
    want = np.array([[p if (p > t and p > 0) else 0.0 for p, t in zip(row, theta)] for row in pre])
    assert_near(sae.encode(X), want)


@pytest.mark.parametrize("normalize", ["constant_norm_rescale", "layer_norm"])
def test_normalised_dictionaries_scale_the_input_and_undo_it_on_the_output(normalize):
    sae = random_sae(ReLU(), normalize=normalize)
    x = X.double().numpy()
    if normalize == "constant_norm_rescale":
        factor = np.linalg.norm(x, axis=-1, keepdims=True) / np.sqrt(8)
        shift, scaled = 0.0, x / factor
    else:
        shift, factor = x.mean(-1, keepdims=True), x.std(-1, ddof=1, keepdims=True)
        scaled = (x - shift) / (factor + 1e-5)
    f = np.maximum(numpy_pre(sae, scaled), 0)
    assert_near(sae.encode(X), f)
    assert_near(sae(X), numpy_decode(sae, f) * factor + shift)


def test_a_transcoder_never_takes_b_dec_off_its_input_and_adds_its_skip():
    torch.manual_seed(0)
    tc = Transcoder(8, 24, ReLU(), "blocks.0.mlp_in", "blocks.0.mlp_out", d_out=6, skip=True)
    with torch.no_grad():
        for p in tc.parameters():
            p.normal_()
    x = X.double().numpy()
    f = np.maximum(x @ tc.W_enc.detach().double().numpy() + tc.b_enc.detach().double().numpy(), 0)
    want = numpy_decode(tc, f) + x @ tc.W_skip.detach().double().numpy().T
    assert_near(tc(X), want)
    assert tc(X).shape == (5, 6)


# ---------------------------------------------------------------------------------------------------------------
# SAELens's format

def test_tensorlens_hook_names_map_to_lumen_sites_and_back():
    pairs = {"blocks.8.hook_resid_pre": "blocks.8.resid_pre", "blocks.0.hook_resid_post": "blocks.0.resid_post",
             "blocks.3.hook_mlp_out": "blocks.3.mlp_out", "blocks.3.hook_attn_out": "blocks.3.attn_out",
             "blocks.2.mlp.hook_post": "blocks.2.mlp_hidden", "blocks.2.ln2.hook_normalized": "blocks.2.mlp_in",
             "blocks.4.hook_resid_mid": "blocks.4.resid_mid"}
    for hook, site in pairs.items():
        assert site_from_hook(hook) == site and hook_from_site(site) == hook
    assert site_from_hook("blocks.1.resid_post") == "blocks.1.resid_post"
    with pytest.raises(ModelFileError, match="hook name 'blocks.1.hook_nonsense' has no lumen site"):
        site_from_hook("blocks.1.hook_nonsense")


def saelens_dir(tmp_path, arch: str, tensors: dict, **cfg) -> str:
    """A dictionary folder as SAELens 6 writes one: its keys and its layouts (W_enc (d_in, d_sae), ...)."""
    folder = tmp_path / arch
    folder.mkdir()
    save_file(tensors, str(folder / "sae_weights.safetensors"))
    (folder / "cfg.json").write_text(json.dumps({
        "architecture": arch, "d_in": 8, "d_sae": 24, "dtype": "float32", "device": "cpu",
        "apply_b_dec_to_input": True, "normalize_activations": "none", "reshape_activations": "none",
        "metadata": {"sae_lens_version": "6.54.12", "hook_name": "blocks.1.hook_resid_post",
                     "model_name": "tiny"}, **cfg}))
    return str(folder)


def weights(seed: int = 0, d_in: int = 8, d_sae: int = 24) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"W_enc": torch.randn(d_in, d_sae, generator=g), "b_enc": torch.randn(d_sae, generator=g),
            "W_dec": torch.randn(d_sae, d_in, generator=g), "b_dec": torch.randn(d_in, generator=g)}


def test_a_saelens_topk_folder_reads_as_topk_with_its_weights(tmp_path):
    w = weights()
    sae = read_saelens(saelens_dir(tmp_path, "topk", w, k=5))
    assert isinstance(sae.act, TopK) and sae.act.k == 5 and sae.site == "blocks.1.resid_post"
    pre = (X - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    kept = pre.topk(5, dim=-1)
    want = torch.zeros_like(pre).scatter(-1, kept.indices, kept.values.relu()) @ w["W_dec"] + w["b_dec"]
    torch.testing.assert_close(sae(X), want)


@pytest.mark.parametrize("sae", [random_sae(TopK(4)), random_sae(JumpReLU(24)), random_sae(BatchTopK(2)),
                                 random_sae(ReLU(), normalize="layer_norm")], ids=["topk", "jumprelu", "batchtopk",
                                                                                  "layer_norm"])
def test_a_dictionary_written_and_read_back_gives_the_same_outputs(tmp_path, sae):
    again = read_saelens(save_saelens(sae, tmp_path / "d"))
    assert type(again.act) is type(sae.act) and again.site == sae.site and again.normalize == sae.normalize
    torch.testing.assert_close(again(X), sae(X), rtol=0, atol=0)
    cfg = json.loads((tmp_path / "d" / "cfg.json").read_text())
    assert cfg["metadata"]["hook_name"] == "blocks.1.hook_resid_post"


def test_a_transcoder_round_trips_with_its_output_site(tmp_path):
    torch.manual_seed(0)
    tc = Transcoder(8, 24, JumpReLU(24), "blocks.0.mlp_in", "blocks.0.mlp_out")
    again = read_saelens(save_saelens(tc, tmp_path / "t"))
    assert isinstance(again, Transcoder) and again.site_out == "blocks.0.mlp_out"
    assert json.loads((tmp_path / "t" / "cfg.json").read_text())["architecture"] == "jumprelu_transcoder"
    torch.testing.assert_close(again(X), tc(X), rtol=0, atol=0)


@pytest.mark.parametrize("case, match", [
    ("shape", r"W_enc is \(8, 23\), but cfg.json's sizes need \(8, 24\)"),
    ("arch", "architecture 'gated' is not one lumen reads"),
    ("threshold", "lacks threshold .a JumpReLU needs its thresholds"),
    ("hook", "no lumen site"),
    ("k", "k must be a whole number from 1 to d_sae"),
    ("pickle", "damaged or not a safetensors file"),
    ("cfg", r"cfg.json.*not valid JSON"),
])
def test_bad_dictionary_folders_are_one_clear_error(tmp_path, case, match):
    w, cfg, arch = weights(), {}, "standard"
    if case == "shape":
        w["W_enc"] = w["W_enc"][:, :23].contiguous()
    elif case == "arch":
        arch = "gated"
    elif case == "threshold":
        arch = "jumprelu"
    elif case == "hook":
        cfg["metadata"] = {"hook_name": "blocks.1.hook_nowhere"}
    elif case == "k":
        arch, cfg["k"] = "topk", 0
    folder = saelens_dir(tmp_path, arch, w, **cfg)
    if case == "pickle":
        import pickle

        (tmp_path / arch / "sae_weights.safetensors").write_bytes(pickle.dumps({"W_enc": 1}))
    elif case == "cfg":
        (tmp_path / arch / "cfg.json").write_text("{")
    with pytest.raises(ModelFileError, match=match):
        read_saelens(folder)


# ---------------------------------------------------------------------------------------------------------------
# spliced into a model

def tiny(activation: str = "gelu") -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(vocab_size=40, context=16, d_model=8, n_layers=2, n_heads=2, activation=activation)).eval()


IDX = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])



def test_the_streams_own_basis_reconstructs_it_and_its_features_are_the_stream():
    model = tiny()
    own, cache = run_with_cache(model, IDX)
    sae = basis_dictionary("blocks.0.resid_post")
    with spliced(model, sae) as seen:
        logits, _ = model(IDX)
    torch.testing.assert_close(logits, own, rtol=1e-6, atol=1e-6)
    x = cache["blocks.0.resid_post"]
    torch.testing.assert_close(seen["blocks.0.resid_post.features"], torch.cat([x.relu(), (-x).relu()], -1))
    assert seen["blocks.0.resid_post.error"].abs().max() < 1e-6


def test_editing_one_feature_is_patching_the_stream_along_its_direction():
    model = tiny()
    x = run_with_cache(model, IDX)[1]["blocks.0.resid_post"]
    sae = basis_dictionary("blocks.0.resid_post")

    def off(f: torch.Tensor, site: str) -> torch.Tensor:
        f = f.clone()
        f[..., 3] = 0  # the positive half of dimension 3
        return f

    with spliced(model, sae, edit=off):
        edited, _ = model(IDX)
    with replace_activation(model, "blocks.0.resid_post", lambda a: a - torch.nn.functional.one_hot(
            torch.tensor(3), 8) * a[..., 3:4].relu()):
        patched, _ = model(IDX)
    torch.testing.assert_close(edited, patched, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(edited, model(IDX)[0]) and x[..., 3].max() > 0


def test_the_error_term_gives_the_models_own_logits_back():
    model = tiny()
    own, _ = model(IDX)
    sae = random_sae(TopK(2))
    with spliced(model, sae) as seen:
        approx, _ = model(IDX)
    with spliced(model, sae, error=True) as again:
        exact, _ = model(IDX)
    assert not torch.allclose(approx, own, atol=1e-3)
    torch.testing.assert_close(exact, own, rtol=1e-5, atol=1e-5)
    site = "blocks.1.resid_post"
    torch.testing.assert_close(again[f"{site}.reconstruction"] + again[f"{site}.error"],
                               run_with_cache(model, IDX)[1][site])
    torch.testing.assert_close(seen[f"{site}.features"], again[f"{site}.features"])


def test_a_transcoder_made_of_a_relu_mlps_weights_is_that_mlp():
    """A ReLU MLP is W2 relu(W1 x + b1) + b2: a ReLU transcoder from the MLP's input to its output. Built from
    the block's own weights, it must leave the model unchanged, and its features are the MLP's hidden units."""
    model = tiny("relu")
    own, cache = run_with_cache(model, IDX, names=["blocks.1.mlp_hidden"])
    mlp = model.blocks[1].mlp
    tc = Transcoder(8, mlp.fc.out_features, ReLU(), "blocks.1.mlp_in", "blocks.1.mlp_out")
    with torch.no_grad():
        tc.W_enc.copy_(mlp.fc.weight.T)
        tc.b_enc.copy_(mlp.fc.bias)
        tc.W_dec.copy_(mlp.proj.weight.T)
        tc.b_dec.copy_(mlp.proj.bias)
    with spliced(model, tc) as seen:
        logits, _ = model(IDX)
    torch.testing.assert_close(logits, own, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(seen["blocks.1.mlp_in.features"], cache["blocks.1.mlp_hidden"], rtol=1e-5, atol=1e-6)


def test_features_of_a_padded_batch_are_each_prompts_alone():
    model = tiny()
    sae = random_sae(TopK(3))
    prompts = [[3, 1, 4, 1, 5], [9, 2], [6, 5, 3, 5]]
    batch = pad(prompts, side="left")
    with spliced(model, sae) as seen:
        model(batch.ids, mask=batch.mask)
        together = seen["blocks.1.resid_post.features"]
        for row, p in enumerate(prompts):
            model(torch.tensor([p]))
            alone = seen["blocks.1.resid_post.features"][0]
            torch.testing.assert_close(together[row][batch.mask[row]], alone, rtol=1e-5, atol=1e-5)


def test_a_dictionary_of_another_width_is_refused_before_the_model_runs():
    with pytest.raises(UserError, match="has width 16, but this model's blocks.1.resid_post is 8 wide"):
        with spliced(tiny(), random_sae(ReLU(), d_in=16)):
            pass


# ---------------------------------------------------------------------------------------------------------------
# the tools, on features

def test_a_features_logits_are_its_decoder_row_through_the_final_norms_gain_and_the_unembedding():
    from lumen.features import feature_logits

    model = tiny()
    sae = random_sae(TopK(3))
    row = sae.W_dec[5].detach()
    want = model.lm_head((row - row.mean()) * model.ln_f.g)   # LayerNorm: centred, then its gain
    torch.testing.assert_close(feature_logits(model, sae, 5), want)
    assert feature_logits(model, sae).shape == (24, 40)


def test_top_contexts_are_where_the_feature_is_largest_over_the_windows():
    from lumen.features import top_contexts
    from lumen.tokenizers import CharTokenizer

    model, tok = tiny(), CharTokenizer([chr(ord("a") + i) for i in range(40)])
    windows = torch.randint(0, 40, (6, 8), generator=torch.Generator().manual_seed(2))
    sae = basis_dictionary("blocks.1.resid_post")
    found = top_contexts(model, sae, tok, windows, feature=11, k=4, batch=4)   # dimension 3, negative half
    x = run_with_cache(model, windows, names=["blocks.1.resid_post"])[1]["blocks.1.resid_post"]
    want = (-x[..., 3]).relu().flatten().topk(4)
    assert [c.activation for c in found] == pytest.approx(want.values.tolist(), rel=1e-5)
    assert [c.trigger for c in found] == [tok.decode([int(windows.flatten()[p])]) for p in want.indices]


def test_feature_attribution_is_the_metrics_gradient_times_the_change():
    """Checked against finite differences: each feature of one position nudged by eps, the metric's change."""
    from lumen.features import feature_attribution

    model = tiny().double()
    sae = random_sae(ReLU()).double()
    clean, corrupt = torch.tensor([[3, 1, 4, 1, 5]]), torch.tensor([[3, 1, 7, 1, 5]])

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logits[0, -1, 4] - logits[0, -1, 9]

    attr = feature_attribution(model, sae, clean, corrupt, metric)
    with torch.no_grad(), spliced(model, sae, error=True) as seen:
        base = metric(model(corrupt)[0])
        f_corrupt = seen["blocks.1.resid_post.features"]
        model(clean)
        change = seen["blocks.1.resid_post.features"] - f_corrupt
    eps = 1e-6
    for j in change[0, 2].abs().topk(3).indices.tolist():   # position 2, where the prompts differ
        def nudge(f: torch.Tensor, site: str, j: int = j) -> torch.Tensor:
            f = f.clone()
            f[0, 2, j] += eps
            return f

        with torch.no_grad(), spliced(model, sae, error=True, edit=nudge):
            slope = (metric(model(corrupt)[0]) - base) / eps
        assert float(attr[0, 2, j]) == pytest.approx(float(change[0, 2, j] * slope), rel=1e-4, abs=1e-9)
    assert attr[0, :2].abs().max() == 0   # before the changed token nothing differs


def test_patching_one_feature_moves_the_stream_along_its_direction_only():
    from lumen.features import patch_feature

    model = tiny()
    sae = basis_dictionary("blocks.0.resid_post")
    patched = patch_feature(model, sae, IDX, feature=2, value=1.5)   # dimension 2's positive half set to 1.5
    with replace_activation(model, "blocks.0.resid_post", lambda a: torch.cat(
            [a[..., :2], 1.5 - (-a[..., 2:3]).relu(), a[..., 3:]], -1)):
        want, _ = model(IDX)
    torch.testing.assert_close(patched, want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# quality, and the command

def test_quality_of_a_perfect_and_of_an_empty_dictionary():
    from lumen.features.quality import quality

    model = tiny()
    windows = torch.randint(0, 40, (6, 8), generator=torch.Generator().manual_seed(3))
    perfect = quality(model, basis_dictionary("blocks.0.resid_post"), windows, batch=4)
    assert perfect.fvu < 1e-10 and perfect.ce_recovered == pytest.approx(1.0, abs=1e-6)
    x = run_with_cache(model, windows, names=["blocks.0.resid_post"])[1]["blocks.0.resid_post"]
    assert perfect.l0 == pytest.approx(float((x != 0).sum(-1).float().mean()))   # one of each sign's half per dim
    assert perfect.dead == pytest.approx(0.0)
    empty = basis_dictionary("blocks.0.resid_post")
    with torch.no_grad():
        empty.W_dec.zero_()
    nothing = quality(model, empty, windows, batch=4)
    assert nothing.ce_recovered == pytest.approx(0.0, abs=1e-6) and nothing.fvu > 1
    assert nothing.loss_spliced == pytest.approx(nothing.loss_zeroed)


def test_quality_is_its_formulas_on_the_sites_activations():
    from lumen.features.quality import quality

    model = tiny()
    sae = random_sae(TopK(3))
    windows = torch.randint(0, 40, (5, 8), generator=torch.Generator().manual_seed(4))
    q = quality(model, sae, windows, batch=2)
    logits, cache = run_with_cache(model, windows, names=["blocks.1.resid_post"])
    x = cache["blocks.1.resid_post"].double().numpy().reshape(-1, 8)
    f = sae.encode(torch.from_numpy(x).float()).detach().double().numpy()
    x_hat = sae(torch.from_numpy(x).float()).detach().double().numpy()
    assert q.fvu == pytest.approx(((x - x_hat) ** 2).sum() / ((x - x.mean(0)) ** 2).sum(), rel=1e-4)
    assert q.l0 == pytest.approx((f > 0).sum(-1).mean()) and q.dead == pytest.approx(1 - (f > 0).any(0).mean())
    nll = -torch.log_softmax(logits[:, :-1].double(), -1).gather(-1, windows[:, 1:, None]).mean()
    assert q.loss == pytest.approx(float(nll), rel=1e-5)


def test_the_features_command_measures_a_dictionary_and_shows_a_feature(tmp_path):
    import os
    import subprocess
    import sys

    from helpers.runs import TEXT, tiny_run

    tiny_run(tmp_path)
    run = tmp_path / "run"
    from lumen.formats import load

    model = load(run).model
    sae = random_sae(TopK(4), d_in=model.cfg.d_model, d_sae=64)
    save_saelens(sae, tmp_path / "sae")
    (tmp_path / "text.txt").write_text(TEXT)
    env = {**os.environ, "LUMEN_OFFLINE": "1", "OMP_NUM_THREADS": "1"}

    def lumen(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "lumen", "features", str(run), "--sae", *args,
                               "--corpus", str(tmp_path / "text.txt"), "--windows", "4", "--seq-len", "16", "-q"],
                              env=env, capture_output=True, text=True, timeout=300)

    measured = lumen(str(tmp_path / "sae"), "--json")
    assert measured.returncode == 0, measured.stderr
    got = json.loads(measured.stdout)
    assert got["site"] == "blocks.1.resid_post" and 0 < got["fvu"] and got["l0"] <= 4
    shown = lumen(str(tmp_path / "sae"), "--feature", "5", "--contexts", "3", "--json")
    assert shown.returncode == 0, shown.stderr
    page = json.loads(shown.stdout)
    assert len(page["contexts"]) == 3 and "[[" in page["contexts"][0]["marked"] and len(page["promoted"]) == 8
    bad = lumen(str(tmp_path / "sae"), "--feature", "64")
    assert bad.returncode == 2 and "feature 64 is out of range" in bad.stderr and "Traceback" not in bad.stderr
    (tmp_path / "sae" / "cfg.json").write_text('{"architecture": "gated"}')
    bad = lumen(str(tmp_path / "sae"))
    assert bad.returncode == 2 and "architecture 'gated'" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_the_cache_holds_features_beside_the_models_own_activations():
    from lumen.features import run_with_cache as run_with_features

    model = tiny()
    sae = random_sae(TopK(3))
    own, plain = run_with_cache(model, IDX)
    logits, cache = run_with_features(model, IDX, sae)
    torch.testing.assert_close(logits, own)
    torch.testing.assert_close(cache["blocks.1.resid_post"], plain["blocks.1.resid_post"])
    torch.testing.assert_close(cache["blocks.1.resid_post.features"], sae.encode(plain["blocks.1.resid_post"]))
