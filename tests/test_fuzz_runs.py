"""Fuzzing what training reads back: run directories and their checkpoints, TOML configs and `--set` values,
metrics.jsonl, the token cache. Each case mutates small valid files that lumen wrote itself (truncation, flipped
bytes, invalid JSON/TOML/UTF-8, missing and extra files) and holds lumen to one property: a LumenError that names
the file (or key), or a run that works and is right; never another exception, never a hang.

"Right" has an independent reference each time: a resumed run ends with exactly the weights of the undisturbed
run (resuming is bit-exact from any intact checkpoint, so a damaged one used silently shows up); an accepted
config satisfies the ranges the issue lists; a token cache yields the tokens it was built with.

Sharded runs (parallel = fsdp) have a family of their own: any file damaged, replaced by a FIFO, or swapped for the
same file of another checkpoint (of the run, or of another run), with or without the manifest rewritten to match
(as whoever changed the files would). Resumed, the run ends with the undisturbed run's weights, and loaded (what
`lumen generate RUN` reads), it gives the weights of one of its intact checkpoints, or either is a LumenError; a
swapped file is always refused. (Bytes changed inside a tensor, under a manifest rewritten to match, are another
checkpoint rather than a damaged one: those cases are held to "no escape, no hang" only.)

    LUMEN_FUZZ_EXAMPLES=2000 pytest -m fuzz tests/test_fuzz_runs.py   # more cases (default: a few hundred)
    LUMEN_FUZZ_TALLY=out.jsonl ...                                      # record outcomes instead of failing
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from lumen import data as D
from lumen.errors import LumenError
from lumen.formats import checkpoint as ckpt
from lumen.train import load_config, to_toml, train

pytestmark = pytest.mark.fuzz

SCALE = int(os.environ.get("LUMEN_FUZZ_EXAMPLES", "0")) / 365 or 1.0  # the default is 365 cases in all
TALLY = os.environ.get("LUMEN_FUZZ_TALLY")
SECONDS = 20  # per case: longer is a hang


def examples(n: int):
    return settings(max_examples=max(1, round(n * SCALE)), deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


class Hung(Exception):
    pass


def outcome(family: str, case: object, fn) -> str:
    """Run one case under a time limit: "ok", "lumen-error", "escaped: TYPE: message", "hung", "wrong: why" (fn
    returns a string saying what is wrong with a result it accepted, or None) or "ugly: message" (a LumenError that
    is not one line of lumen's own words: empty, several lines, a traceback, torch's weights_only advice)."""
    def alarm(signum, frame):
        raise Hung()

    msg = ""
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(SECONDS)
    try:
        wrong = fn()
        result = f"wrong: {wrong}" if wrong else "ok"
    except Hung:
        result = "hung"
    except LumenError as e:
        msg = str(e).strip()
        ugly = not msg or "\n" in msg or any(w in msg for w in ("Traceback", "weights_only", "Weights only"))
        result = f"ugly: {msg[:200]!r}" if ugly else "lumen-error"
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - what the property forbids
        result = f"escaped: {type(e).__name__}: {str(e)[:200]}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    if TALLY:
        with open(TALLY, "a") as f:
            f.write(json.dumps({"family": family, "case": repr(case)[:300], "outcome": result, "said": msg[:300]})
                    + "\n")
    else:
        assert result in ("ok", "lumen-error"), f"{family} {case!r}: {result}"
    return result


# ---------------------------------------------------------------------------------------------------------------
# a tiny corpus and run, written by lumen itself

TEXT = "".join(f"{w} and {v}, said the {n}th voice;\n" for n, (w, v) in
               enumerate(zip(["to be", "not to be", "a rose", "the sea"] * 90, ["more", "less", "once", "all"] * 90)))
SETS = ["progress=false", "dtype=float32", "threads=1", "steps=6", "eval_interval=2", "keep_last=10",
        "sample_tokens=4", "eval_windows=4", "batch_size=2", "model.context=16"]


@pytest.fixture(scope="module", autouse=True)
def no_plots():
    """The loss plot is not what is fuzzed here, and drawing it is most of a tiny run's time."""
    from lumen.train.rundir import RunDir

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RunDir, "plot", lambda *a, **k: None)
        yield


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz-corpus")
    (root / "corpus.txt").write_text(TEXT)
    return root / "corpus.txt"


@pytest.fixture(scope="module")
def data(corpus, tmp_path_factory):
    return D.prepare(str(corpus), "char", cache=tmp_path_factory.mktemp("fuzz-cache"))


def run_config(corpus: Path, out: Path, *sets: str):
    return load_config(preset="tiny", sets=[f"corpus='{corpus}'", f"out_dir='{out}'", *SETS, *sets])


@pytest.fixture(scope="module")
def base(corpus, data, tmp_path_factory):
    """A run stopped at step 4 (checkpoints 2 and 4, as a killed run leaves it) and the weights its undisturbed
    end (step 6) has."""
    root = tmp_path_factory.mktemp("fuzz-run")
    full = root / "full"
    train(*run_config(corpus, full), data=data)
    reference = load_file(str(full / "checkpoints" / "step-000006" / "model.safetensors"))
    killed = root / "killed"
    shutil.copytree(full, killed)
    shutil.rmtree(killed / "checkpoints" / "step-000006")
    for f in ("summary.json", "best.json"):
        (killed / f).unlink(missing_ok=True)
    return killed, reference


def files_of(run: Path) -> list[str]:
    return sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())


def mutate(path: Path, how: str, draw) -> None:
    raw = path.read_bytes()
    if how == "truncate":
        path.write_bytes(raw[: draw(st.integers(0, max(0, len(raw) - 1)))])
    elif how == "flip":
        b = bytearray(raw)
        for _ in range(draw(st.integers(1, 4))):
            if b:
                i = draw(st.integers(0, len(b) - 1))
                b[i] ^= 1 << draw(st.integers(0, 7))
        path.write_bytes(bytes(b))
    elif how == "garbage":
        path.write_bytes(draw(st.sampled_from([b"", b"{", b"\xff\xfe\x00", b"null", b"[]", b'{"files": 3}',
                                               b"step = 'x'", b"\x80abc"])))
    elif how == "delete":
        path.unlink()
    elif how == "zero-middle":
        b = bytearray(raw)
        i = draw(st.integers(0, max(0, len(b) - 1)))
        b[i: i + 64] = bytes(len(b[i: i + 64]))
        path.write_bytes(bytes(b))


HOWS = ["truncate", "flip", "garbage", "delete", "zero-middle"]


def resumed_right(corpus: Path, data, run: Path, reference: dict) -> str | None:
    """Resume and check the run ends with the undisturbed run's weights."""
    result = train(*run_config(corpus, run), data=data, resume=True)
    if result.steps != 6:
        return f"ended at step {result.steps}"
    got = load_file(str(run / "checkpoints" / "step-000006" / "model.safetensors"))
    if got.keys() != reference.keys() or not all(torch.equal(got[k], reference[k]) for k in got):
        return "resumed to other weights than the undisturbed run (a damaged checkpoint was used)"
    return None


@examples(40)
@given(st.data())
def test_resume_from_a_damaged_run_directory(tmp_path_factory, corpus, data, base, d):
    killed, reference = base
    run = tmp_path_factory.mktemp("case") / "run"
    shutil.copytree(killed, run)
    target = d.draw(st.sampled_from(files_of(run)))
    how = d.draw(st.sampled_from(HOWS))
    mutate(run / target, how, d.draw)
    if d.draw(st.booleans()):  # and an extra file or folder
        extra = d.draw(st.sampled_from(["checkpoints/step-abc/", "checkpoints/step-000008/", "checkpoints/x.txt",
                                        "checkpoints/step-000004/extra.bin", "checkpoints/.tmp-step-000006-x/"]))
        (run / extra.rstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        if extra.endswith("/"):
            (run / extra).mkdir(exist_ok=True)
        else:
            (run / extra).write_bytes(b"\x00" * 10)
    outcome("resume", (target, how), lambda: resumed_right(corpus, data, run, reference))


@examples(60)
@given(st.data())
def test_trainer_state_files(tmp_path_factory, base, d):
    killed, _ = base
    path = tmp_path_factory.mktemp("case") / "step"
    shutil.copytree(killed / "checkpoints" / "step-000004", path)
    how = d.draw(st.sampled_from(["truncate", "flip", "garbage", "zero-middle"]))
    mutate(path / "trainer.pt", how, d.draw)

    def read() -> str | None:
        state = ckpt.load_trainer_state(path)
        return None if isinstance(state, dict) and isinstance(state.get("step"), int) else f"read {type(state)}"
    outcome("trainer.pt", how, read)


# ---------------------------------------------------------------------------------------------------------------
# sharded runs

@pytest.fixture(scope="module")
def sharded_base(corpus, data, tmp_path_factory):
    """A sharded run (parallel = fsdp, one process) stopped at step 4, the weights of its checkpoints 2 and 4 and
    of its undisturbed end (step 6), and another sharded run of the same shapes (seed 7) to take files from."""
    root = tmp_path_factory.mktemp("fuzz-sharded")
    full, other = root / "full", root / "other"
    train(*run_config(corpus, full, "parallel=fsdp"), data=data)
    train(*run_config(corpus, other, "parallel=fsdp", "seed=7", "steps=4"), data=data)
    weights = {n: ckpt.read_sharded_state(full / "checkpoints" / f"step-{n:06d}") for n in (2, 4, 6)}
    killed = root / "killed"
    shutil.copytree(full, killed)
    shutil.rmtree(killed / "checkpoints" / "step-000006")
    (killed / "summary.json").unlink()
    (killed / "best.json").write_text(json.dumps({"checkpoint": "step-000004", "val_loss": 3.0}))
    return killed, weights, other


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


SHARDED_HOWS = [*HOWS, "fifo", "swap-step", "swap-run"]


@examples(30)
@given(st.data())
def test_sharded_run_directory(tmp_path_factory, corpus, data, sharded_base, d):
    killed, weights, other = sharded_base
    run = tmp_path_factory.mktemp("case") / "run"
    shutil.copytree(killed, run)
    target = d.draw(st.sampled_from(files_of(run)))
    how = d.draw(st.sampled_from(SHARDED_HOWS))
    parts = Path(target).parts
    in_step = len(parts) > 2 and parts[0] == "checkpoints"
    before = (run / target).read_bytes()
    if how == "fifo":
        (run / target).unlink()
        os.mkfifo(run / target)
    elif how.startswith("swap") and in_step:  # the same file of the run's other checkpoint, or of another run
        source = {"step-000004": "step-000002", "step-000002": "step-000004"}[parts[1]] if how == "swap-step" \
            else parts[1]
        donor = (run if how == "swap-step" else other) / "checkpoints" / source / Path(*parts[2:])
        if donor.is_file():
            shutil.copy(donor, run / target)
    elif not how.startswith("swap"):
        mutate(run / target, how, d.draw)
    rewrite = in_step and d.draw(st.booleans()) and target.rsplit("/", 1)[-1] != ckpt.MANIFEST
    if rewrite:
        ckpt.write_manifest(run / "checkpoints" / parts[1])
    swapped = how.startswith("swap") and (run / target).read_bytes() != before  # wrong by construction
    trusted = not rewrite or swapped  # a tensor's bytes changed under a rewritten manifest: another checkpoint

    def loaded_right() -> str | None:
        state = ckpt.read_run(run).state
        if swapped and (run / "checkpoints" / parts[1]) == ckpt.resolve(run):
            return "read a checkpoint put together from two"
        if trusted and not any(same_weights(state, weights[n]) for n in (2, 4)):
            return "read other weights than any intact checkpoint's"
        return None

    def resumed_right() -> str | None:
        result = train(*run_config(corpus, run, "parallel=fsdp"), data=data, resume=True)
        if result.steps != 6:
            return f"ended at step {result.steps}"
        if trusted and not same_weights(ckpt.read_sharded_state(run / "checkpoints" / "step-000006"), weights[6]):
            return "resumed to other weights than the undisturbed run (a damaged checkpoint was used)"
        return None

    if d.draw(st.booleans()):
        outcome("sharded load", (target, how, rewrite), loaded_right)
    else:
        outcome("sharded resume", (target, how, rewrite), resumed_right)


# ---------------------------------------------------------------------------------------------------------------
# configs

def config_is_sane(cfg, model_cfg) -> str | None:
    """The ranges issue 12 asks a config to be held to (written here, independently of TrainConfig)."""
    floats = {k: getattr(cfg, k) for k in ("lr", "min_lr", "weight_decay", "grad_clip", "temperature", "max_time",
                                            "beta1", "beta2", "val_fraction")}
    bad = [k for k, v in floats.items() if not math.isfinite(v) or v < 0]
    bad += [k for k in ("beta1", "beta2") if not floats[k] < 1]
    bad += [k for k in ("steps", "batch_size", "grad_accum", "eval_interval", "eval_windows") if getattr(cfg, k) <= 0]
    corpus = [cfg.corpus] if isinstance(cfg.corpus, str) else cfg.corpus
    if not corpus or any(not isinstance(c, str) or not c.strip() for c in corpus):
        bad.append("corpus")
    if not isinstance(cfg.out_dir, str) or not cfg.out_dir.strip():
        bad.append("out_dir")
    if cfg.min_lr > cfg.lr or not 0 < cfg.val_fraction < 1:
        bad.append("lr/min_lr/val_fraction")
    for k, v in model_cfg.to_dict().items():
        if isinstance(v, float) and not math.isfinite(v):
            bad.append(f"model.{k}")
    if bad:
        return f"accepted {bad}"
    again = load_config_text(to_toml(cfg, model_cfg))  # what lumen writes, it reads back the same
    return None if again == (cfg, model_cfg) else "to_toml does not read back the same config"


def load_config_text(text: str):
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "c.toml").write_text(text)
        return load_config(Path(tmp) / "c.toml")


@examples(80)
@given(st.data())
def test_config_files(tmp_path_factory, d):
    cfg, model_cfg = load_config(preset="tiny")
    path = tmp_path_factory.mktemp("case") / "config.toml"
    path.write_text(to_toml(cfg, model_cfg))
    how = d.draw(st.sampled_from(["truncate", "flip", "garbage", "zero-middle", "line"]))
    if how == "line":  # one line replaced by key = a value of any type
        lines = path.read_text().splitlines()
        i = d.draw(st.integers(1, len(lines) - 1))
        key = lines[i].split("=")[0].strip() or "steps"
        lines[i] = f"{key} = {d.draw(TOML_VALUES)}"
        path.write_text("\n".join(lines) + "\n")
    else:
        mutate(path, how, d.draw)
    outcome("config.toml", how, lambda: config_is_sane(*load_config(path)))


TOML_VALUES = st.sampled_from(["nan", "inf", "-inf", "-1", "0", "-0.5", "1e400", "2.5", "true", "\"\"", "\"x\"",
                               "[]", "[1, 2]", "{}", "1979-05-27", "9223372036854775807", "-9223372036854775808",
                               "\"\\u0000\"", "'''a\nb'''", "0x10", "1e-45"])
KEYS = ["lr", "min_lr", "max_time", "weight_decay", "temperature", "beta1", "beta2", "grad_clip", "warmup", "seed",
        "corpus", "tokenizer", "vocab_size", "validation", "val_fraction", "device", "dtype", "out_dir",
        "sample_prompt", "eval_windows", "keep_last", "threads", "model.norm_eps", "model.rope_theta",
        "model.dropout", "model.preset", "model", "model.norm_placement", "model.activation"]


@examples(80)
@given(key=st.sampled_from(KEYS), value=TOML_VALUES)
def test_set_values(key, value):
    outcome("--set", (key, value), lambda: config_is_sane(*load_config(preset="tiny", sets=[f"{key}={value}"])))


RUN_KEYS = ["lr", "min_lr", "temperature", "weight_decay", "beta2", "sample_prompt", "corpus", "validation",
            "val_fraction", "eval_windows", "seed", "grad_clip", "warmup"]


@examples(20)
@given(key=st.sampled_from(RUN_KEYS), value=TOML_VALUES)
def test_a_run_starts_or_refuses(tmp_path_factory, corpus, key, value):
    """Accepted settings train and evaluate (two steps, a sample), else a LumenError before the first step."""
    def start() -> str | None:
        cfg, m = run_config(corpus, tmp_path_factory.mktemp("case"), "steps=2", "save=false", f"{key}={value}")
        r = train(cfg, m)
        return None if r.final_val_loss is not None and math.isfinite(r.final_val_loss) else "no validation loss"
    outcome("run", (key, value), start)


# ---------------------------------------------------------------------------------------------------------------
# metrics.jsonl and the token cache

@examples(15)
@given(st.data())
def test_metrics_log(tmp_path_factory, corpus, data, base, d):
    killed, reference = base
    run = tmp_path_factory.mktemp("case") / "run"
    shutil.copytree(killed, run)
    metrics = run / "metrics.jsonl"
    how = d.draw(st.sampled_from(["truncate", "flip", "garbage", "zero-middle", "append"]))
    if how == "append":
        with open(metrics, "ab") as f:
            f.write(d.draw(st.sampled_from([b'{"step": 5, "lo', b"[1, 2]\n", b'{"step": "x"}\n', b"\xff\n",
                                            b'{"loss": 1}\n', b"null\n"])))
    else:
        mutate(metrics, how, d.draw)
    outcome("metrics.jsonl", how, lambda: resumed_right(corpus, data, run, reference))


@examples(40)
@given(st.data())
def test_token_cache(tmp_path_factory, corpus, d):
    cache = tmp_path_factory.mktemp("cache")
    good = D.prepare(str(corpus), "char", cache=cache)
    expected = good.tokens("train").tobytes(), good.tokens("val").tobytes()
    folder = good.folder
    del good
    target = d.draw(st.sampled_from(sorted(p.name for p in folder.iterdir())))
    how = d.draw(st.sampled_from(HOWS))
    mutate(folder / target, how, d.draw)

    def reopen() -> str | None:
        again = D.prepare(str(corpus), "char", cache=cache)
        same = (again.tokens("train").tobytes(), again.tokens("val").tobytes()) == expected
        return None if same else "the damaged cache entry was used"
    outcome("token cache", (target, how), reopen)
