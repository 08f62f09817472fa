"""docs/speed.md is generated: bench/results.py's Record writes a bench's results as JSON, bench/speed_doc.py
renders each marked section of the page from them. The numbers on the page are the JSON's (read back from the
rendered table, an independent route), a section that never ran says which command fills it, and a page
without a bench's markers is refused in one line."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))  # the benches import each other as top-level modules (bench/ is not a package)

import results  # noqa: E402
import speed_doc  # noqa: E402


def marked(*names: str) -> str:
    return "# Speed\n\nprose written by hand\n\n" + "".join(
        f"## {n}\n\n<!-- measured: {n} -->\nstale text\n<!-- end: {n} -->\n\nmore prose\n\n" for n in names)


def section(page: str, name: str) -> str:
    m = re.search(rf"<!-- measured: {name} -->\n(.*?)\n<!-- end: {name} -->", page, flags=re.S)
    assert m, f"no {name} section in the rendered page"
    return m.group(1)


def rows(text: str) -> list[list[str]]:
    """The body rows of the markdown table in text, cell by cell (the header and the rule dropped)."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


def numbers(cell: str) -> list[float]:
    return [float(x.replace(",", "")) for x in re.findall(r"\d[\d,]*\.?\d*", cell)]


def smollm2_record(tmp_path: Path) -> Path:
    def who(pre: float, dec: float) -> dict:
        return {"prefill_tok_s": pre, "decode_tok_s": dec, "prefill_tok_cpu_s": pre / 2, "decode_tok_cpu_s": dec / 2,
                "weights_mib": 500.0, "peak_extra_mib_prefill": 10.0, "peak_extra_mib_decode": 5.0}

    with results.Record("smollm2", tmp_path) as rec:
        rec.update(prefill=256, decode=32, repeats=1, threads=2)
        rec["dtypes"] = {
            "float32": {"lumen": who(524.0, 20.4), "lumen-compiled": who(514.0, 59.4), "hf": who(469.0, 18.1),
                        "same_tokens": {"lumen": True, "lumen-compiled": True}, "compile_s": 61.0},
            "bfloat16": {"lumen": who(975.0, 27.9), "lumen-compiled": who(1031.0, 77.5), "hf": who(979.0, 25.0),
                         "same_tokens": {"lumen": True, "lumen-compiled": False}, "compile_s": 70.0}}
    return rec.path


def test_a_record_renders_its_own_numbers(tmp_path):
    path = smollm2_record(tmp_path)
    saved = json.loads(path.read_text())
    assert saved["machine"]["cores"] and len(saved["load_before"]) == len(saved["load_after"]) == 3

    page = speed_doc.render(marked("smollm2", "train"), tmp_path)
    assert "stale text" not in section(page, "smollm2") and page.count("more prose") == 2
    body = rows(section(page, "smollm2"))
    assert [r[0] for r in body] == ["prefill fp32, 256 tokens", "decode fp32, 32 tokens", "prefill bf16, 256 tokens",
                                    "decode bf16, 32 tokens"]
    for r, (dtype, task) in zip(body, [(d, t) for d in ("float32", "bfloat16") for t in ("prefill", "decode")]):
        d = saved["dtypes"][dtype]
        # the three contenders' figures, parsed back from the page, are the JSON's to its rounding
        got = [numbers(cell)[0] for cell in r[1:4]]
        want = [d[who][f"{task}_tok_s"] for who in ("lumen", "lumen-compiled", "hf")]
        assert got == pytest.approx(want, abs=0.051)
        # the ratio is the best lumen over HF, computed here from the JSON
        best = max(want[:2]) / want[2]
        assert numbers(r[4])[0] == pytest.approx(best, abs=0.0051)
    hf32 = saved["dtypes"]["float32"]["hf"]["decode_tok_s"]
    assert numbers(body[3][4])[1] == pytest.approx(77.5 / hf32, abs=0.0051)  # bf16 decoding against HF fp32
    assert "compiled NO" in section(page, "smollm2")  # the bf16 compiled tokens differed: the page says so
    # the provenance line: machine, date, load before and after, the command that measured it
    m = saved["machine"]
    assert f"{m['cores']}-core {m['cpu']}" in page and saved["date"] in page
    assert f"load average {saved['load_before'][0]:.1f} before, {saved['load_after'][0]:.1f} after" in page


def test_train_and_contention_tables_are_their_json(tmp_path):
    with results.Record("train", tmp_path) as rec:
        rec.update(layers=6, d_model=384, context=256, batch=8, steps=2, repeats=1, device="cpu")
        rec["rows"] = [{"impl": impl, "dtype": dtype, "compiled": False, "tokens_per_s": tps, "mfu": tps / 3000,
                        "peak_mib": mib, "matmul_peak_tflops": 0.2}
                       for impl, dtype, tps, mib in (("hf", "float32", 1903.0, 570.0), ("lumen", "float32", 2066.0,
                                                     381.0), ("hf", "bfloat16", 3309.0, 325.0),
                                                     ("lumen", "bfloat16", 3251.0, 294.0))]
    with results.Record("contention", tmp_path) as rec:
        rec.update(seconds=1.0, rounds=1)
        rec["decode"] = {"title": "compiled decoding", "cores": 2, "threads": 2, "loads": [[1.0, 2.0, 3.0]],
                         "rows": [{"busy": 0, "fair": 600.0, "fixed": 600.0, "tuned": 590.0},
                                  {"busy": 1, "fair": 300.0, "fixed": 139.0, "tuned": 375.0},
                                  {"busy": 2, "fair": 200.0, "fixed": 103.0, "tuned": 224.0}]}
    page = speed_doc.render(marked("train", "contention"), tmp_path)

    train = json.loads(next(tmp_path.glob("train@*.json")).read_text())
    body = rows(section(page, "train"))
    assert [r[0] for r in body] == ["fp32 eager", "bf16 autocast eager"]
    for r, dtype in zip(body, ("float32", "bfloat16")):
        x = {row["impl"]: row for row in train["rows"] if row["dtype"] == dtype}
        for cell, impl in ((r[1], "lumen"), (r[2], "hf")):
            tps, mfu, mib = numbers(cell)
            assert (tps, mfu, mib) == (round(x[impl]["tokens_per_s"]), round(100 * x[impl]["mfu"]),
                                       round(x[impl]["peak_mib"]))
        assert numbers(r[3])[0] == pytest.approx(x["lumen"]["tokens_per_s"] / x["hf"]["tokens_per_s"], abs=0.0051)
    # the headline goal: lumen's best bf16 over HF's best setting, whichever dtype that was
    assert f"**{3251 / 3309:.2f}x** (goal >= 1.5x)" in section(page, "train")

    body = rows(section(page, "contention"))
    assert [numbers(r[0])[0] for r in body] == [0, 1, 2] and "number of cores" in body[2][0]
    for r, row in zip(body, json.loads(next(tmp_path.glob("contention@*.json")).read_text())["decode"]["rows"]):
        assert numbers(r[1]) == [round(row["fixed"]), round(row["tuned"])]
        assert numbers(r[2]) == pytest.approx([row["tuned"] / 600.0, row["tuned"] / row["fair"]], abs=0.0051)


def test_the_speedrun_table_is_its_json(tmp_path):
    with results.Record("speedrun", tmp_path) as rec:
        rec.update(goal=1.40, milestone=1.50, budget=300.0)
        rec["rows"] = [{"row": i, "what": what, "sets": sets, "steps": steps, "tokens": steps * 2048,
                        "seconds": secs, "nats_per_char": score, "time_to_milestone": at}
                       for i, (what, sets, steps, secs, score, at) in enumerate((
                           ("AdamW", ["optimizer=adamw"], 2400, 281.6, 1.4521, None),
                           ("Muon", [], 2000, 290.2, 1.3987, 101.3)))]
    body = rows(section(speed_doc.render(marked("speedrun"), tmp_path), "speedrun"))
    saved = json.loads(next(tmp_path.glob("speedrun@*.json")).read_text())["rows"]
    assert [r[1] for r in body] == ["AdamW", "Muon"] and body[0][2] == "`optimizer=adamw`"
    for r, x in zip(body, saved):
        assert numbers(r[3]) == [x["steps"]] and numbers(r[5]) == [round(x["seconds"])]
        assert numbers(r[7]) == [round(x["nats_per_char"], 3)]
    assert body[0][6] == "" and numbers(body[1][6]) == [101]  # never reached 1.50; reached at 101 s
    assert numbers(body[1][8]) == [round(abs(1.3987 - 1.4521), 3)] and body[1][8].startswith("-")


def test_the_instruction_set_table_is_its_json(tmp_path):
    contenders = {"nanogpt": "nanoGPT", "lumen-float32": "lumen fp32", "lumen-bfloat16": "lumen bf16"}
    secs = {("native", "nanogpt"): 0.010, ("avx2", "nanogpt"): 0.025, ("native", "lumen-float32"): 0.08,
            ("avx2", "lumen-float32"): 0.6, ("native", "lumen-bfloat16"): 0.05, ("avx2", "lumen-bfloat16"): 3.0}
    with results.Record("train_isa", tmp_path) as rec:
        rec.update(rounds=2, steps=20, threads=[1, 2], contenders=contenders, isas=["native", "avx2"], rows=[
            {"isa": i, "contender": c, "threads": t, "seconds": s * (1.5 if t == 1 else 1.0),
             "tokens": 768 if c == "nanogpt" else 2048,
             **({} if c == "nanogpt" else {"main_jobs_dtype": (c == "lumen-bfloat16") == (i == "native")})}
            for (i, c), s in secs.items() for t in (1, 2)])
    body = rows(section(speed_doc.render(marked("train_isa"), tmp_path), "train_isa"))
    assert [r[0] for r in body] == list(contenders.values())
    for r, c in zip(body, contenders):
        cells = {(i, t): r[1 + 2 * k + (t - 1)] for k, i in enumerate(("native", "avx2")) for t in (1, 2)}
        for (i, t), cell in cells.items():
            s = secs[(i, c)] * (1.5 if t == 1 else 1.0)
            tokens = 768 if c == "nanogpt" else 2048
            assert numbers(cell) == [round(1e3 * s, 1), round(tokens / s)]
            # bold: the dtype the main job itself takes on that instruction set (bf16 natively here, fp32 on AVX2)
            assert cell.startswith("**") == (c != "nanogpt" and (c == "lumen-bfloat16") == (i == "native"))
        assert numbers(r[5]) == numbers(r[6]) == [round(secs[("avx2", c)] / secs[("native", c)], 2)]


def test_a_bench_that_never_ran_says_which_command_fills_it(tmp_path):
    page = speed_doc.render(marked(*speed_doc.RENDER), tmp_path)  # an empty results folder
    for name in speed_doc.RENDER:
        text = section(page, name)
        assert text.startswith("Not measured on this machine yet")
        if name in speed_doc.SCRIPT:
            assert f"`.venv/bin/python bench/{speed_doc.SCRIPT[name]}`" in text
            assert (BENCH / speed_doc.SCRIPT[name]).is_file()
    assert "bench/vs_nanogpt.py eval" in section(page, "nanogpt")
    assert "bench/bench_llamacpp.py --stand-in avx2`" in section(page, "llamacpp_avx2")
    assert "bench/vs_nanogpt.py isa NANOGPT`" in section(page, "train_isa")


def test_a_failed_bench_writes_nothing(tmp_path):
    with pytest.raises(RuntimeError), results.Record("train", tmp_path) as rec:
        rec["rows"] = []
        raise RuntimeError("the bench broke")
    assert results.read("train", tmp_path) is None


def test_the_page_without_a_bench_s_markers_is_refused_in_one_line(tmp_path, capsys):
    page = tmp_path / "speed.md"
    text = marked(*[n for n in speed_doc.RENDER if n != "train"])
    page.write_text(text)
    with pytest.raises(SystemExit) as exit:
        speed_doc.main(["--page", str(page), "--results", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert exit.value.code == 2 and len(err.splitlines()) == 1
    assert str(page) in err and "<!-- measured: train -->" in err and "add its markers" in err
    assert page.read_text() == text  # nothing rewritten

    page.write_text(marked(*speed_doc.RENDER, "nonesuch"))
    with pytest.raises(SystemExit) as exit:
        speed_doc.main(["--page", str(page), "--results", str(tmp_path)])
    assert exit.value.code == 2 and "nonesuch" in capsys.readouterr().err


def test_the_real_page_has_every_bench_s_section():
    text = speed_doc.PAGE.read_text()
    for name in speed_doc.RENDER:
        assert text.count(f"<!-- measured: {name} -->") == text.count(f"<!-- end: {name} -->") == 1
    assert "Earlier measurements" not in text  # history belongs to git


def test_each_kind_of_machine_keeps_its_own_table(tmp_path, monkeypatch):
    """A bench run on an AVX2-only machine and on an AMX one: two files, two tables, each with its CPU and flags."""
    machines = {"avx2": {"cpu": "AMD EPYC 7551", "arch": "x86_64", "cores": 2, "flags": ["avx2", "fma"],
                         "amx": False, "python": "3.11", "torch": "2.13.0"},
                "amx": {"cpu": "Intel Xeon", "arch": "x86_64", "cores": 2, "amx": True, "python": "3.11",
                        "torch": "2.13.0", "flags": ["amx_tile", "amx_int8", "avx512_vnni", "avx512f", "avx2"]}}
    for name, m in machines.items():
        monkeypatch.setattr(results, "machine", lambda m=m: dict(m))
        with results.Record("speedrun", tmp_path) as rec:
            rec.update(goal=1.40, milestone=1.50, budget=300.0)
            rec["rows"] = [{"row": 0, "what": name, "sets": [], "steps": 10, "tokens": 20480, "seconds": 5.0,
                            "nats_per_char": 2.0, "time_to_milestone": None}]
        assert rec.path.name == f"speedrun@{name}.json"
    text = section(speed_doc.render(marked("speedrun"), tmp_path), "speedrun")
    amx, avx2 = text.index("**AVX-512 with AMX:**"), text.index("**AVX2 only (no AVX-512):**")
    assert amx < avx2 and [r[1] for r in rows(text[:avx2])] == ["amx"] and [r[1] for r in rows(text[avx2:])] == ["avx2"]
    assert "AMD EPYC 7551 (x86_64: avx2, fma; no AMX" in text[avx2:] and "Intel Xeon (x86_64: amx_tile" in text[:avx2]
