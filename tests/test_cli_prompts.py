"""`lumen lens / attribute / patch --prompts FILE`: a dataset of prompts run as padded batches. Each prompt's
numbers must be what the single-prompt command prints for it (run once per prompt, unpadded: an independent
route), the averages the mean of those, and --json the same numbers as the text; a bad file is one line
naming the file and the line."""

from __future__ import annotations

import json
import re

import pytest
import torch

from helpers.runs import PAIRS, TEXT, peaked_run
from lumen.cli import main
from lumen.tokenizers import CharTokenizer

# prompts of different lengths (so the batches pad), answers one character each (the tokenizer's tokens)
PROMPTS = [("It is the east", "e", "a"), ("Juliet is the sun", " ", "s"), ("ROMEO", ".", "R"),
           ("But soft, what light", " ", "t")]
TOL = 2e-5   # the JSON's 6 decimals, and float32 rounding between a padded batch and a prompt alone


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return peaked_run(tmp_path_factory.mktemp("prompts_cli"))


def lumen(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def jsonl(path, rows: list[dict]):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def close(a, b, tol: float = TOL) -> bool:
    return all(abs(x - y) <= tol for x, y in zip(a, b, strict=True))


def test_lens_prompts_are_each_prompt_alone(run, capsys, tmp_path):
    f = jsonl(tmp_path / "p.jsonl", [{"prompt": p, "answer": a, "wrong": w} for p, a, w in PROMPTS])
    data = json.loads(lumen(capsys, "lens", run, "--prompts", f, "--batch-size", 3, "--json"))
    text = lumen(capsys, "lens", run, "--prompts", f, "--batch-size", 3)
    assert [r["line"] for r in data["prompts"]] == [1, 2, 3, 4]
    singles = []
    for (p, a, w), row in zip(PROMPTS, data["prompts"]):
        alone = json.loads(lumen(capsys, "lens", run, "--prompt", p, "--answer", a, "--wrong", w, "--json"))
        layers = alone["logit lens"]["layers"]
        values = [v[-1] for v in alone["logit lens"]["answer"]["values"]]   # at the last position
        assert close(row["kl"], [layer["kl"][-1] for layer in layers])
        assert close(row["top1_prob"], [layer["top"][-1][0][1] for layer in layers])
        assert row["top1"] == [layer["top"][-1][0][0] for layer in layers]
        assert close(row["values"], values)
        said = lumen(capsys, "lens", run, "--prompt", p, "--answer", a, "--wrong", w)
        first = re.search(r"first becomes top-1 after (embed|block \d+)", said).group(1)
        assert (row["first_top1"], first) in [(0, "embed")] + [(i + 1, f"block {i}") for i in range(3)]
        singles.append((values, [layer["kl"][-1] for layer in layers], row["first_top1"]))
        # the text line of this prompt: its final top-1's probability and the last block's reading
        line = re.search(rf"^\s+{row['line']}\s+\S+\s+([\d.]+)\s+(?:embed|block \d)\s+([-+][\d.]+)$", text, re.M)
        assert float(line.group(1)) == pytest.approx(row["top1_prob"][-1], abs=0.006)
        assert float(line.group(2)) == pytest.approx(row["values"][-1], abs=6e-5)
    assert max(abs(v) for s in singles for v in s[0]) > 0.5   # the readings are not all ~0 (a test that can fail)
    mean = data["mean"]
    n = len(PROMPTS)
    assert close(mean["values"], [sum(s[0][i] for s in singles) / n for i in range(4)])
    assert close(mean["kl"], [sum(s[1][i] for s in singles) / n for i in range(4)])
    assert mean["first_top1"] == pytest.approx(sum(s[2] for s in singles) / n)
    assert f"{mean['values'][-1]:+.4f}" in text.split("mean over")[1].splitlines()[2]   # the row of block 2


def test_lens_plain_text_prompts_and_answers_from_the_command_line(run, capsys, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("".join(p + "\n" for p, _, _ in PROMPTS))
    data = json.loads(lumen(capsys, "lens", run, "--prompts", f, "--answer", "e", "--json"))
    for (p, _, _), row in zip(PROMPTS, data["prompts"]):
        alone = json.loads(lumen(capsys, "lens", run, "--prompt", p, "--answer", "e", "--json"))["logit lens"]
        assert row["prompt"] == p and row["what"] == "logit['e']"
        assert close(row["values"], [v[-1] for v in alone["answer"]["values"]])


def test_attribute_prompts_are_each_prompt_alone(run, capsys, tmp_path):
    f = jsonl(tmp_path / "p.jsonl", [{"prompt": p, "answer": a, "wrong": w} for p, a, w in PROMPTS])
    data = json.loads(lumen(capsys, "attribute", run, "--prompts", f, "--batch-size", 3, "--json"))
    text = lumen(capsys, "attribute", run, "--prompts", f, "--batch-size", 3)
    rows = data["prompts"]
    for (p, a, w), row in zip(PROMPTS, rows):
        alone = json.loads(lumen(capsys, "attribute", run, "--prompt", p, "--contrast", a, w, "--json"))
        assert (row["target"], row["minus"]) == (a, w) == (alone["target"][-1], alone["minus"][-1])
        assert row["logit"] == pytest.approx(alone["logit"][-1], abs=TOL)
        assert close(row["components"].values(), [v[-1] for v in alone["components"].values()])
        assert list(row["components"]) == list(alone["components"])
        assert close([x for layer in row["heads"] for x in layer], [h[-1] for layer in alone["heads"] for h in layer])
        assert f"line {row['line']:>4}: logit[{a!r}] - logit[{w!r}] = {row['logit']:.4f}" in text
    assert max(abs(r["logit"]) for r in rows) > 0.5
    mean = data["mean"]
    assert mean["logit"] == pytest.approx(sum(r["logit"] for r in rows) / len(rows), abs=1e-6)
    for c in mean["components"]:
        assert mean["components"][c] == pytest.approx(sum(r["components"][c] for r in rows) / len(rows), abs=1e-6)
    assert sum(mean["components"].values()) == pytest.approx(mean["logit"], abs=1e-4)   # the mean still adds up
    assert f"= {mean['logit']:.4f}; the mean components sum to" in text


def test_attribute_plain_prompts_split_each_ones_own_prediction(run, capsys, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("\n".join(p for p, _, _ in PROMPTS[:2]))   # no newline after the last line
    rows = json.loads(lumen(capsys, "attribute", run, "--prompts", f, "--json"))["prompts"]
    for (p, _, _), row in zip(PROMPTS, rows):
        alone = json.loads(lumen(capsys, "attribute", run, "--prompt", p, "--json"))
        assert row["minus"] is None and row["target"] == alone["target"][-1]
        assert row["logit"] == pytest.approx(alone["logit"][-1], abs=TOL)


def test_patch_prompts_are_each_pair_alone(run, capsys, tmp_path):
    f = jsonl(tmp_path / "pairs.jsonl", [{"clean": c, "corrupt": x, "answer": a, "wrong": w} for c, x, a, w in PAIRS])
    kinds = ["resid_pre", "head"]
    data = json.loads(lumen(capsys, "patch", run, "--prompts", f, "--kinds", *kinds, "--batch-size", 2, "--json"))
    text = lumen(capsys, "patch", run, "--prompts", f, "--kinds", *kinds, "--batch-size", 2)
    alone = [json.loads(lumen(capsys, "patch", run, "--clean", c, "--corrupt", x, "--answer", a, "--wrong", w,
                              "--kinds", *kinds, "--json")) for c, x, a, w in PAIRS]
    for pair, single in zip(data["pairs"], alone):
        assert pair["metric"] == single["metric"] and pair["clean_tokens"] == single["clean_tokens"]
        assert pair["clean_metric"] == pytest.approx(single["clean_metric"], abs=TOL)
        assert pair["corrupt_metric"] == pytest.approx(single["corrupt_metric"], abs=TOL)
        for kind in kinds:
            got, want = torch.tensor(pair["maps"][kind]), torch.tensor(single["maps"][kind])
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert (f"{single['metric']}: clean {single['clean_metric']:.4f}, corrupt {single['corrupt_metric']:.4f}"
                in text)
    assert max(abs(s["clean_metric"] - s["corrupt_metric"]) for s in alone) > 0.1
    # the dataset's maps: mean patched metric against the mean clean and corrupt, aligned at the last token
    clean = sum(s["clean_metric"] for s in alone) / len(alone)
    corrupt = sum(s["corrupt_metric"] for s in alone) / len(alone)
    T = min(len(s["clean_tokens"]) for s in alone)
    for kind in kinds:
        patched = [s["corrupt_metric"] + torch.tensor(s["maps"][kind], dtype=torch.float64)
                   * (s["clean_metric"] - s["corrupt_metric"]) for s in alone]
        if kind == "resid_pre":
            patched = [v[:, -T:] for v in patched]
        want = (torch.stack(patched).mean(0) - corrupt) / (clean - corrupt)
        torch.testing.assert_close(torch.tensor(data["mean"][kind], dtype=torch.float64), want, atol=1e-3, rtol=1e-3)
    assert [p["line"] for p in data["pairs"]] == [1, 2, 3]


def test_the_python_api_gives_the_commands_numbers(run, capsys, tmp_path):
    """lumen.prompts + lumen.inspect.datasets, called from Python on the run's own model, give what --json prints;
    the means are the means of the rows (computed here from the rows, another route)."""
    from helpers.models import peaked_tiny_model
    from lumen.inspect import LogitLens
    from lumen.inspect.datasets import attribute_prompts, lens_prompts, patch_prompts
    from lumen.prompts import read_prompts

    model, tok = peaked_tiny_model(TEXT)
    f = jsonl(tmp_path / "p.jsonl", [{"prompt": p, "answer": a, "wrong": w} for p, a, w in PROMPTS])
    prompts = read_prompts(f, tok, model.cfg.context)
    lens = lens_prompts(model, prompts, LogitLens(model), tokenizer=tok, batch_size=3)
    cli = json.loads(lumen(capsys, "lens", run, "--prompts", f, "--batch-size", 3, "--json"))
    assert {"lens": "logit lens", "file": str(f), **lens.to_dict()} == cli
    torch.testing.assert_close(lens.mean()["values"], lens.values.double().sum(0) / len(PROMPTS))
    assert lens.values.abs().max() > 0.5

    attribution = attribute_prompts(model, prompts, tok, batch_size=3)
    cli = json.loads(lumen(capsys, "attribute", run, "--prompts", f, "--batch-size", 3, "--json"))
    assert {"file": str(f), **attribution.to_dict(lambda i: tok.decode([i]))} == cli
    logits = [float(a.logit[-1]) for a in attribution.results]
    assert float(attribution.mean.logit[0]) == pytest.approx(sum(logits) / len(logits), abs=1e-9)
    assert float(attribution.mean.values.sum()) == pytest.approx(sum(logits) / len(logits), abs=1e-4)

    pairs = jsonl(tmp_path / "pairs.jsonl", [{"clean": c, "corrupt": x, "answer": a, "wrong": w}
                                             for c, x, a, w in PAIRS])
    found = patch_prompts(model, read_prompts(pairs, tok, model.cfg.context, pairs=True), kinds=["resid_pre"],
                          methods=("exact", "attribution"), tokenizer=tok, batch_size=2)
    cli = json.loads(lumen(capsys, "patch", run, "--prompts", pairs, "--kinds", "resid_pre", "--method", "both",
                           "--batch-size", 2, "--json"))
    for method, dataset in found.items():
        got = dataset.to_dict()
        assert [p["maps"] for p in got["pairs"]] == [p["maps"] for p in cli[method]["pairs"]]
        assert got["mean"] == cli[method]["mean"]
        clean = sum(p["clean_metric"] for p in cli[method]["pairs"]) / len(PAIRS)
        assert dataset.clean_metric == pytest.approx(clean, abs=1e-9)
        assert dataset.averaged().clean_tokens == [str(t) for t in range(-min(len(c) for c, *_ in PAIRS), 0)]


@pytest.mark.parametrize("command, files", [("lens", ("lens.json", "kl.png", "answer.png")),
                                           ("attribute", ("attribution.json", "attribution.png"))])
def test_out_with_prompts_writes_what_json_prints_and_the_mean_figures(run, capsys, tmp_path, command, files):
    f = jsonl(tmp_path / "p.jsonl", [{"prompt": p, "answer": a, "wrong": w} for p, a, w in PROMPTS])
    data = json.loads(lumen(capsys, command, run, "--prompts", f, "--json"))
    text = lumen(capsys, command, run, "--prompts", f, "--out", tmp_path / "out")
    assert json.loads((tmp_path / "out" / files[0]).read_text()) == data and len(data["prompts"]) == len(PROMPTS)
    for png in files[1:]:
        written = (tmp_path / "out" / png).read_bytes()
        assert written[:4] == b"\x89PNG" and len(written) > 5000
    assert f"wrote {tmp_path / 'out'}/{files[0]} (every prompt and the mean)" in text


@pytest.mark.parametrize("command, content, message", [
    ("lens", "", "p.txt is empty: give one prompt per line"),
    ("lens", "It is\n\nthe east\n", "p.txt, line 2: a blank line"),
    ("lens", '{"prompt": "It is"}\n{"prompt": "the east",}\n', "p.txt, line 2, column 23: not valid JSON"),
    ("lens", '{"prompt": "It is"}\n["the east"]\n', "p.txt, line 2, holds a list, not the JSON object"),
    ("attribute", '{"prompt": "It is"}\n{"answer": "e"}\n', "p.txt, line 2: no 'prompt' field"),
    ("attribute", '{"prompt": "It is", "answr": "e"}\n', "p.txt, line 1: unknown field 'answr'"),
    ("attribute", '{"prompt": "It is", "answer": "e"}\n{"prompt": "sun"}\n', "p.txt, line 2: lacks an 'answer'"),
    ("attribute", '{"prompt": "It is", "answer": " Mary"}\n', "p.txt, line 1: the answer ' Mary' is 5 tokens"),
    ("attribute", '{"prompt": "It is", "answer": 3}\n', "p.txt, line 1: 'answer' must be a non-empty string"),
    ("lens", '{"prompt": "It is", "wrong": "e"}\n', "p.txt, line 1: a 'wrong' token without an 'answer'"),
    ("lens", "It is the east\n" + "Juliet is the sun. " * 4 + "\n", "p.txt, line 2: the prompt is 76 tokens"),
    ("lens", "It is the east \u2603\n", "p.txt, line 1: character '\u2603' is not in this character vocabulary"),
    ("lens", '{"prompt": ""}\n', "p.txt, line 1: 'prompt' must be a non-empty string"),
    ("patch", "It is the east\n", "p.txt, line 1: patch reads pairs"),
    ("patch", '{"clean": "It is", "corrupt": "It was"}\n', "p.txt, line 1: the clean prompt is 5 tokens and the "
                                                          "corrupted one 6"),
    ("patch", '{"clean": "It is", "corrupt": "It it", "answer": "e", "wrong": "e"}\n', "p.txt, line 1: the "
                                                                                      "answer and the wrong token"),
    ("lens", b"It is\n\xff\n", "p.txt, line 2, column 1: byte 0xff is not UTF-8"),
    ("lens", '{"prompt": "It is", "answer": ' + "7" * 5000 + '}\n', "p.txt, line 1: not a prompt line (a number in "
                                                                "it has more digits than Python reads"),
])
def test_a_bad_prompt_file_is_one_line_naming_it(run, capsys, tmp_path, command, content, message):
    f = tmp_path / "p.txt"
    f.write_bytes(content if isinstance(content, bytes) else content.encode())
    code = main([command, str(run), "--prompts", str(f)])
    _, err = capsys.readouterr()
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_lone_surrogate_is_one_line_for_a_byte_and_a_bpe_tokenizer(capsys, tmp_path):
    """JSON's "\\ud800" is half of a UTF-16 pair: neither UTF-8 bytes nor a BPE's text can hold it."""
    from lumen import GPT, ModelConfig
    from lumen.formats.checkpoint import save_checkpoint
    from lumen.tokenizers import ByteTokenizer, train_bpe

    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "It is"}\n{"prompt": "It is \\ud800 the east"}\n')
    for name, tok in (("byte", ByteTokenizer()), ("bpe", train_bpe([TEXT], vocab_size=300))):
        torch.manual_seed(0)
        cfg = ModelConfig(vocab_size=tok.vocab_size, context=32, d_model=16, n_layers=1, n_heads=2)
        save_checkpoint(tmp_path / name, GPT(cfg), tokenizer=tok)
        for command in ("lens", "attribute"):
            code = main([command, str(tmp_path / name), "--prompts", str(f)])
            _, err = capsys.readouterr()
            assert code == 2 and len(err.strip().splitlines()) == 1, err
            assert "p.jsonl, line 2: character '\\ud800' (position 6) is half of a UTF-16 surrogate pair" in err, err


def test_a_file_of_old_mac_line_ends_is_one_prompt_a_line(run, capsys, tmp_path):
    """Lines ended by CR alone (classic Mac OS) or CR LF (Windows) are the prompts a file of LF ends holds."""
    unix = tmp_path / "unix.txt"
    unix.write_text("".join(p + "\n" for p, _, _ in PROMPTS))
    want = json.loads(lumen(capsys, "lens", run, "--prompts", unix, "--answer", "e", "--json"))["prompts"]
    assert len(want) == len(PROMPTS)
    for end in ("\r", "\r\n"):
        f = tmp_path / "p.txt"
        f.write_bytes("".join(p + end for p, _, _ in PROMPTS).encode())
        got = json.loads(lumen(capsys, "lens", run, "--prompts", f, "--answer", "e", "--json"))["prompts"]
        assert [r["prompt"] for r in got] == [p for p, _, _ in PROMPTS]
        assert [r["values"] for r in got] == [r["values"] for r in want]


@pytest.mark.parametrize("argv, message", [
    (["attribute", "--position", "0"], "--position reads one prompt"),
    (["patch", "--clean", "It is"], "--clean reads one prompt"),
    (["lens", "--batch-size", "0"], "--batch-size must be at least 1"),
])
def test_options_for_one_prompt_are_refused_beside_prompts(run, capsys, tmp_path, argv, message):
    f = jsonl(tmp_path / "p.jsonl", [{"clean": "It is", "corrupt": "It it"}] if argv[0] == "patch"
              else [{"prompt": "It is"}])
    code = main([argv[0], str(run), "--prompts", str(f)] + [a.format(tmp=tmp_path) for a in argv[1:]])
    _, err = capsys.readouterr()
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_answers_in_the_file_and_on_the_command_line_are_refused_together(run, capsys, tmp_path):
    f = jsonl(tmp_path / "p.jsonl", [{"prompt": "It is", "answer": "e"}])
    for argv in (["attribute", "--contrast", "e", "a"], ["lens", "--answer", "e"]):
        assert main([argv[0], str(run), "--prompts", str(f), *argv[1:]]) == 2
        err = capsys.readouterr().err
        assert "p.jsonl names an answer on every line: leave out the command line's" in err, err


def test_too_many_prompts_and_too_large_a_batch_are_refused(run, capsys, tmp_path, monkeypatch):
    import lumen.prompts as prompts

    f = tmp_path / "p.txt"
    f.write_text("".join(p + "\n" for p, _, _ in PROMPTS))
    monkeypatch.setattr(prompts, "MAX_PROMPTS", 3)
    assert main(["lens", str(run), "--prompts", str(f)]) == 2
    assert "p.txt holds 4 lines, more prompts than a command reads at once (3)" in capsys.readouterr().err
    monkeypatch.setattr(prompts, "MAX_PROMPTS", 4)
    V = CharTokenizer.from_text(TEXT).vocab_size
    monkeypatch.setattr(prompts, "MAX_BATCH_BYTES", 4 * 20 * V * 4 - 1)   # less than 4 prompts' float32 logits
    assert main(["attribute", str(run), "--prompts", str(f), "--batch-size", "4"]) == 2
    err = capsys.readouterr().err
    assert "--batch-size 4: 4 prompts padded to 20 tokens (line 4)" in err and "give a smaller --batch-size" in err
    assert main(["attribute", str(run), "--prompts", str(f), "--batch-size", "1", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["prompts"]) == 4


def test_a_missing_prompt_file_a_folder_and_a_device(run, capsys, tmp_path):
    for path, message in ((tmp_path / "none.txt", "no prompt file at"), (tmp_path, "is a folder, not a prompt file"),
                          ("/dev/zero", "/dev/zero is not a regular file")):
        assert main(["lens", str(run), "--prompts", str(path)]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.smoke  # (this feature's real-model test in make test)
def test_attribute_prompts_on_smollm2(smollm2, smollm2_tokenizer, capsys, tmp_path):
    """IOI-style prompts: each one's logit difference split, as the library splits that prompt alone."""
    from lumen.inspect import attribute

    tok = smollm2_tokenizer
    rows = [{"prompt": "When Mary and John went to the store, John gave a drink to", "answer": " Mary",
             "wrong": " John"},
            {"prompt": "When Tom and Anna went to the park, Anna gave a ball to", "answer": " Tom", "wrong": " Anna"}]
    f = jsonl(tmp_path / "ioi.jsonl", rows)
    data = json.loads(lumen(capsys, "attribute", "smollm2", "--prompts", f, "--json"))
    for r, got in zip(rows, data["prompts"]):
        a = attribute(smollm2.eval(), tok.encode(r["prompt"]),
                      contrast=(tok.single_token(r["answer"]), tok.single_token(r["wrong"])))
        assert got["logit"] == pytest.approx(float(a.logit[-1]), abs=1e-3)
        assert got["logit"] > 0   # SmolLM2 prefers the indirect object
        assert sum(got["components"].values()) == pytest.approx(got["logit"], abs=1e-3)
