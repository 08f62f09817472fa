"""The chapter's claims as experiments: every experiment runs at its quick size and writes its table, JSON and
figures; and where the quick result is robust, it is held to the chapter's numbers or to the expected
direction (the full-size results are in docs/experiments.md)."""

import json
import math

import pytest

from lumen import ModelConfig
from lumen.cli import main
from lumen.experiments import EXPERIMENTS, load_all, run, write_doc
from lumen.experiments.result import Result, Table

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return tmp_path_factory.mktemp("experiments")


@pytest.fixture(scope="module")
def results(out):
    """Every experiment, quick size, seed 0, run once for this module (about two minutes on two cores)."""
    return {name: run(name, quick=True, seed=0, out=out) for name in EXPERIMENTS}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_experiment_writes_table_json_and_figures(results, out, name):
    r = results[name]
    folder = out / name
    table = (folder / "table.md").read_text()
    assert table.startswith(f"## {name}") and "| --- |" not in table and "|---|" in table
    assert r.verdict and r.verdict in table
    numbers = json.loads((folder / "numbers.json").read_text())
    assert numbers["name"] == name and numbers["quick"] is True and numbers["seed"] == 0
    assert numbers["tables"] and all(len(row) == len(t["columns"]) for t in numbers["tables"] for row in t["rows"])
    pngs = sorted(folder.glob("*.png"))
    assert [p.stem for p in pngs] == sorted(r.figures)
    assert pngs and all(p.read_bytes()[:8] == PNG_MAGIC and p.stat().st_size > 5000 for p in pngs)
    assert not list(folder.glob(".*"))  # no temporary files left behind


@pytest.mark.slow
def test_init_scaling_stream_grows_2N_times_more_without_the_rule(results):
    n = results["init-scaling"].numbers
    # the chapter's case is GPT-2 XL's N = 48, and the curves hold the stream after the embedding and every block
    assert n["n_layers"] == ModelConfig.from_name("gpt2-xl").n_layers
    assert len(n["variance_with_rule"]) == len(n["variance_without_rule"]) == n["n_layers"] + 1
    two_n = 2 * n["n_layers"]
    assert two_n / 2 < n["added_variance_ratio"] < two_n * 2      # the chapter: 2N sigma^2 against sigma^2
    assert math.sqrt(two_n) / 1.5 < n["final_std_ratio"] < math.sqrt(two_n) * 1.5   # "a factor of about 10"
    with_rule = n["variance_with_rule"]
    assert with_rule[-1] / with_rule[0] < 0.1 * n["variance_without_rule"][-1] / n["variance_without_rule"][0]


@pytest.mark.slow
def test_accounting_formula_equals_flop_counter(results):
    n = results["accounting"].numbers
    for name, p in n["presets"].items():
        assert p["measured"]["forward"] == pytest.approx(p["predicted"]["total"], rel=1e-12), name
        assert p["measured"]["attention_core"] == pytest.approx(p["predicted"]["attention_core"], rel=1e-12), name
        assert p["measured"]["backward"] / p["measured"]["forward"] == pytest.approx(2.0, abs=0.01), name
    assert 0.18 < n["gpt2_core_share_1024"] < 0.25                    # "about 20% extra"
    blocks, _ = n["context_sweep"]["gpt2_crossover"]
    assert blocks == 6 * 768                                          # 4 L d = 2 x 12 d^2 at L = 6d


@pytest.mark.slow
def test_depth_plain_stack_gradient_vanishes(results):
    n = results["depth"].numbers
    grads = n["grad_norms_at_init"]
    deepest = max(grads["residual"], key=int)
    assert int(deepest) >= 32
    residual_first = grads["residual"][deepest][0]
    assert grads["plain-unnormed"][deepest][0] < 1e-3 * residual_first   # no highway, no norms: it vanishes
    # the residual stack's gradient reaches the bottom undiminished: first and last block within 2x
    assert 0.5 < grads["residual"][deepest][0] / grads["residual"][deepest][-1] < 2


@pytest.mark.slow
def test_mixing_mlp_learns_the_xor_attention_alone_lags(results):
    xor = results["mixing"].numbers["xor"]
    full = next(v for k, v in xor.items() if k.startswith("full"))
    attention = [v for k, v in xor.items() if k.startswith("attention-only")]
    assert full["accuracy"] > 0.95
    # the MLP gets below 0.1 nats first (attention alone may get there too, through its softmax, but later)
    assert full["steps_to_0.1"] is not None
    assert all(a["steps_to_0.1"] is None or a["steps_to_0.1"] > full["steps_to_0.1"] for a in attention)


@pytest.mark.slow
def test_norm_placement_gradients_at_init(results):
    g = results["norm-placement"].numbers["grad_norms_at_init"]
    assert max(g["pre"]) / min(g["pre"]) < 2                           # pre-LN: even across layers
    assert max(g["post"]) / min(g["post"]) > 5                         # post-LN: uneven
    # ...but block by block only block 1 stands out, and with embeddings of unit size not even that one
    assert g["post"][0] > 5 * max(g["post"][1:]) and max(g["post"][1:]) / min(g["post"][1:]) < 1.3
    unit = results["norm-placement"].numbers["grad_norms_at_init_unit_embeddings"]["post"]
    assert max(unit) / min(unit) < 1.3


@pytest.mark.slow
def test_activations_equal_parameters_and_dead_units_counted(results):
    n = results["activations"].numbers
    assert len({v["params"] for v in n.values()}) == 1                 # SwiGLU at 8/3 d == a 4d MLP
    assert 0 <= n["ReLU"]["dead_init"] <= n["ReLU"]["dead_trained"] <= 1
    assert n["GELU"]["dead_init"] is None


@pytest.mark.slow
def test_dropout_slows_fitting_and_a_small_slice_is_memorised(results):
    n = results["dropout"].numbers
    fresh0, fresh1, slice0 = (next(v for k, v in n.items() if k.startswith(a) and k.endswith(b))
                              for a, b in (("fresh", "p=0.0"), ("fresh", "p=0.1"), ("2,000", "p=0.0")))
    assert fresh1["final_loss"] > fresh0["final_loss"]                 # dropout adds noise to training
    assert slice0["final_loss"] < fresh0["final_loss"]                 # repeated data is fitted more closely


@pytest.mark.slow
def test_looking_inside_smollm2(results):
    lens = results["logit-lens"].numbers["smollm2"]
    assert lens["rows"][0][:3] == ["The capital of France is", "' Paris'", "yes"]
    assert lens["mean_settled_layer"] > lens["n_layers"] / 2            # the answer forms late
    assert lens["input_top1_by_layer"][0] >= 0.75                       # layer 0 reads back the input token
    d = results["delete-layer"].numbers["smollm2"]
    assert d["first"] > 5 * d["middle_median"] > 0                      # the first block is essential
    kv = results["key-value-memories"].numbers["neurons"]
    assert kv and all(n["trigger_share"] >= 0.5 and "[[" in n["contexts"][0]["marked"] for n in kv)
    heads = results["attention-heads"].numbers["SmolLM2-135M"]
    assert len(heads["induction"]) == 30 and len(heads["induction"][0]) == 9
    assert max(max(row) for row in heads["induction"]) > 0.5             # SmolLM2 has induction heads
    fact = results["fact-recall"].numbers
    dla = fact["attribution"]                                            # the writes add up to the logit difference
    assert dla["embed"] + sum(dla["attn"]) + sum(dla["mlp"]) == pytest.approx(fact["logit_diff_clean"], abs=1e-4)
    assert fact["logit_diff_clean"] > 0 > fact["logit_diff_corrupt"]     # ' Paris' after Eiffel, else ' Rome'
    same = [t for t in range(len(fact["tokens"])) if t not in fact["subject_positions"]]
    first = fact["patching"]["maps"]["resid_pre"][0]                     # the stream entering block 0 is the embedding:
    assert max(abs(first[t]) for t in same) < 1e-5                       # where the tokens agree, nothing to restore


@pytest.mark.slow
def test_same_seed_same_numbers(tmp_path):
    a, b = (run("norms", quick=True, seed=3) for _ in range(2))
    del a.numbers["timing_seconds"], b.numbers["timing_seconds"]
    assert a.numbers == b.numbers
    c = run("norms", quick=True, seed=4)
    assert c.numbers["layernorm"]["loss"] != a.numbers["layernorm"]["loss"]


@pytest.mark.slow
def test_doc_collects_every_result(results, out, tmp_path):
    loaded = load_all(out)
    assert [r.name for r in loaded] == list(EXPERIMENTS)
    assert all(a.verdict == results[a.name].verdict and [t.title for t in a.tables] == [t.title for t in
               results[a.name].tables] for a in loaded)
    doc = write_doc(loaded, tmp_path / "experiments.md", out, "lumen experiment all --quick")
    text = doc.read_text()
    assert all(f"## {name}" in text for name in EXPERIMENTS)
    links = [line.split("](")[1].rstrip(")") for line in text.splitlines() if line.startswith("![")]
    assert len(links) >= len(EXPERIMENTS) and all((doc.parent / link).resolve().is_file() for link in links)
    minutes = sum(r.seconds for r in results.values()) / 60
    assert "Machine:" in text and f"Wall time: {minutes:.1f} minutes" in text


@pytest.mark.slow
def test_cli(tmp_path, capsys):
    assert main(["experiment", "norms", "--quick", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "norms" / "table.md").is_file() and (tmp_path / "norms" / "norms.png").is_file()
    assert "| layernorm |" in capsys.readouterr().out
    assert main(["experiment", "nope"]) == 2
    assert "unknown experiment 'nope'" in capsys.readouterr().err
    assert main(["experiment", "norms", "--out", str(tmp_path), "--doc", str(tmp_path / "x.md")]) == 2
    assert "no results for mixing, depth" in capsys.readouterr().err   # the page needs every experiment's result
    assert Result.load(tmp_path / "norms").verdict


def test_table_formats_numbers():
    md = Table("t", ["a", "b", "c"], [[1234567, 0.000123, 3.14159], [12, float("nan"), None]]).markdown()
    assert "| 1,234,567 | 0.000123 | 3.142 |" in md and "| 12 | nan |  |" in md


def test_a_synthetic_task_trains_through_lumen_train_loop():
    """mixing's XOR task reaches lumen.train's loop as a TaskData: the loop's first loss is the loss of the untrained
    model on the windows the loop's own generator draws (computed here by hand), and training lowers it."""
    import copy

    import torch

    from lumen.experiments.fit import train_lm
    from lumen.experiments.mixing import OwnFeatureXor

    task = OwnFeatureXor(features=4, d_model=16, context=8, seed=0)
    torch.manual_seed(0)
    model = task.model(ModelConfig(d_model=16, n_layers=1, n_heads=2, activation="gelu"), "residual")
    data = task.data()
    x, y = data.batch("train", data.random_starts("train", 8, 4, torch.Generator().manual_seed(0)), 8)
    assert torch.equal(y, task.answer[x]) and x.shape == (4, 8)
    with torch.no_grad():
        first = float(model.eval()(x, y)[1])
    hist = train_lm(copy.deepcopy(model), data, steps=20, lr=1e-2, batch_size=4, seed=0, eval_windows=4)
    assert not hist.diverged and len(hist.loss) == 20
    assert hist.loss[0] == pytest.approx(first, rel=1e-5)
    assert hist.final_loss < 0.8 * first
