"""Sharded checkpoints in one process (no process group, so fast): what torch.distributed.checkpoint writes reads
back to the same bits, as whole tensors for loading and into a model and optimizer for resuming; the index is
never unpickled into arbitrary objects; damaged shards and an index that does not fit the config are one clear
error; the `parallel` setting is checked where it is read; gloo's lost-peer errors are told from other errors.
Through the real command (issue 38): a run whose best checkpoint is damaged, made a FIFO, or put together from two
checkpoints is named in one line by `lumen generate`, and passed over by `lumen train --resume`, which then ends with
the undisturbed run's weights."""

from __future__ import annotations

import json
import pickle
import shutil

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception

from lumen import GPT
from lumen.errors import CheckpointError, ConfigError
from lumen.formats import checkpoint as ckpt
from lumen.formats import load
from lumen.tokenizers import CharTokenizer
from lumen.train import load_config
from lumen.train.distributed import lost_peer
from lumen.train.optim import make_optimizer

# a character vocabulary of the model's 40 ids
CHARS = CharTokenizer([chr(ord("a") + i) for i in range(26)] + [str(i) for i in range(10)] + list(" .,;"))


def trained(tie: bool = True, seed: int = 0) -> tuple[GPT, torch.optim.Optimizer]:
    """A tiny model after two AdamW steps (so the optimizer holds moments worth keeping)."""
    torch.manual_seed(seed)
    model = GPT.from_preset("baby-gpt", n_layers=2, d_model=32, n_heads=2, vocab_size=40, context=16,
                            tie_embeddings=tie)
    opt = make_optimizer(model, 1e-2, 0.1, (0.9, 0.95))
    for _ in range(2):
        x = torch.randint(0, 40, (2, 16))
        model(x, x)[1].backward()
        opt.step()
        opt.zero_grad()
    return model, opt


@pytest.fixture
def sharded(tmp_path):
    model, opt = trained()
    state = {"step": 2, "tokens": 64, "best": 1.5, "data_generator": torch.Generator().get_state(),
             "torch_rng": [torch.get_rng_state()], "world": 1, "train_config": "{}"}
    path = ckpt.save_sharded_checkpoint(tmp_path / "step-000002", model, opt, CHARS, {"step": 2}, state)
    return path, model, opt


def test_a_sharded_checkpoint_is_a_complete_model_spec(sharded):
    path, model, _ = sharded
    assert ckpt.is_checkpoint(path) and ckpt.is_sharded(path) and not (path / ckpt.WEIGHTS).exists()
    ckpt.verify(path)
    read = ckpt.read_sharded_state(path)
    expected = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}  # the tied matrix once
    assert read.keys() == expected.keys() and all(torch.equal(read[k], expected[k]) for k in read)
    both = load(path)
    loaded, tok = both.model, both.tokenizer
    x = torch.randint(0, 40, (1, 16))
    assert torch.equal(loaded(x)[0], model.eval()(x)[0]) and tok.decode(tok.encode("cab")) == "cab"
    assert loaded.lm_head.weight is loaded.tok_emb.weight


def test_an_untied_model_keeps_both_matrices(tmp_path):
    model, opt = trained(tie=False)
    path = ckpt.save_sharded_checkpoint(tmp_path / "c", model, opt)
    read = ckpt.read_sharded_state(path)
    assert torch.equal(read["lm_head.weight"], model.lm_head.weight.detach())
    assert not torch.equal(read["lm_head.weight"], read["tok_emb.weight"][:, :32])


def test_resuming_restores_the_weights_and_adamw_moments(sharded):
    path, model, opt = sharded
    fresh, fresh_opt = trained(seed=1)  # other weights, other moments
    groups = ckpt.load_trainer_state(path)["optimizer"]["param_groups"]
    ckpt.load_sharded(path, fresh, fresh_opt, groups)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))
    for p, q in zip(model.parameters(), fresh.parameters()):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt.state[p][key], fresh_opt.state[q][key]), key
    # and the next step is the same step
    x = torch.randint(0, 40, (2, 16))
    for m, o in ((model, opt), (fresh, fresh_opt)):
        m.train()(x, x)[1].backward()
        o.step()
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))


def test_the_index_is_never_unpickled_into_arbitrary_objects(sharded, tmp_path):
    path, _, _ = sharded
    witness = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (shutil.copy, (str(path / ckpt.CONFIG), str(witness)))

    (path / ckpt.SHARD_INDEX).write_bytes(pickle.dumps(Payload()))
    ckpt.write_manifest(path)  # the manifest agrees: the index's own wall is what is tested
    with pytest.raises(CheckpointError, match=r"\.metadata is damaged .*names shutil\.copy"):
        ckpt.read_sharded_state(path)
    assert not witness.exists()


class Planted:
    """A pickle that, unpickled, copies a file to a witness path: proof that code ran."""

    def __init__(self, source: str, witness: str):
        self.source, self.witness = source, witness

    def __reduce__(self):
        return (shutil.copy, (self.source, self.witness))


def plant_bytes_entry(path, witness, key: str = "model.tok_emb.weight") -> None:
    """Mark one entry of a sharded checkpoint's index as bytes and point it at a pickle appended to a shard: what
    torch reads as bytes it unpickles with torch.load(weights_only=False)."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    index = pickle.loads((path / ckpt.SHARD_INDEX).read_bytes())  # our own file, just written
    (shard,) = (path / ckpt.SHARDS).glob("*.distcp")
    payload = pickle.dumps(Planted(str(path / ckpt.CONFIG), str(witness)))
    offset = shard.stat().st_size
    with shard.open("ab") as f:
        f.write(payload)
    info = next(iter(index.storage_data.values()))
    index.state_dict_metadata[key] = BytesStorageMetadata()
    index.storage_data[MetadataIndex(key)] = type(info)(relative_path=info.relative_path, offset=offset,
                                                         length=len(payload))
    (path / ckpt.SHARD_INDEX).write_bytes(pickle.dumps(index))


@pytest.mark.parametrize("key", ["model.tok_emb.weight", "optimizer.tok_emb.weight.exp_avg"])
def test_an_index_entry_marked_as_bytes_is_refused_before_torch_unpickles_it(sharded, tmp_path, key):
    path, _, _ = sharded
    witness = tmp_path / "ran"
    plant_bytes_entry(path, witness, key)
    ckpt.write_manifest(path)
    fresh, fresh_opt = trained(seed=1)
    groups = ckpt.load_trainer_state(path)["optimizer"]["param_groups"]
    with pytest.raises(CheckpointError, match=rf"marks '{key}' as BytesStorageMetadata, not a tensor"):
        ckpt.load_sharded(path, fresh, fresh_opt, groups)  # resuming
    with pytest.raises(CheckpointError, match="not a tensor"):
        ckpt.read_sharded_state(path)  # loading (generate, convert, eval, ...)
    assert not witness.exists()


def test_no_read_of_a_shard_asks_for_bytes(sharded):
    """The second wall, should an index ever get past the first: the reader refuses a request for bytes."""
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

    path, _, _ = sharded
    item = ReadItem(type=LoadItemType.BYTE_IO, dest_index=MetadataIndex("x"), dest_offsets=torch.Size([0]),
                    storage_index=MetadataIndex("x"), storage_offsets=torch.Size([0]), lengths=torch.Size([0]))
    with pytest.raises(CheckpointError, match="reads an entry as bytes"):
        ckpt._ShardReader(path / ckpt.SHARDS).read_data(LoadPlan([item]), None)


def test_an_index_that_does_not_fit_the_config_is_refused_before_anything_is_allocated(sharded):
    path, _, _ = sharded
    cfg = json.loads((path / ckpt.CONFIG).read_text())
    (path / ckpt.CONFIG).write_text(json.dumps({**cfg, "d_model": 64, "n_heads": 2}))
    ckpt.write_manifest(path)
    with pytest.raises(CheckpointError, match=r"tok_emb\.weight is \(40, 32\), but config\.json needs \(40, 64\)"):
        ckpt.read_sharded_state(path)
    (path / ckpt.CONFIG).write_text(json.dumps({**cfg, "n_layers": 3}))
    ckpt.write_manifest(path)
    with pytest.raises(CheckpointError, match="holds 2 blocks but config.json says n_layers = 3"):
        ckpt.read_sharded_state(path)


def test_an_index_whose_pieces_leave_a_hole_is_refused(sharded):
    path, _, _ = sharded
    index = pickle.loads((path / ckpt.SHARD_INDEX).read_bytes())  # our own file, just written
    emb = index.state_dict_metadata["model.tok_emb.weight"]
    half = emb.chunks[0].sizes[0] // 2  # the piece says it covers only half the rows
    emb.chunks[0] = type(emb.chunks[0])(offsets=emb.chunks[0].offsets,
                                        sizes=torch.Size([half, *emb.chunks[0].sizes[1:]]))
    (path / ckpt.SHARD_INDEX).write_bytes(pickle.dumps(index))
    ckpt.write_manifest(path)
    with pytest.raises(CheckpointError, match="the pieces of tok_emb.weight do not make up the whole tensor"):
        ckpt.read_sharded_state(path)


def test_a_damaged_shard_is_one_clear_error(sharded):
    path, _, _ = sharded
    (shard,) = (path / ckpt.SHARDS).glob("*.distcp")
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 10])
    with pytest.raises(CheckpointError, match="has .* bytes, the manifest says"):
        ckpt.verify(path)
    with pytest.raises(CheckpointError, match="has .* bytes, the manifest says"):
        ckpt.read_sharded_state(path)  # checked against the manifest before it is read
    ckpt.write_manifest(path)  # a manifest rewritten to match: torch's reader meets the damage
    with pytest.raises(CheckpointError, match="cannot be read .*: it is damaged"):
        ckpt.read_sharded_state(path)


def test_a_manifest_lists_nothing_outside_the_checkpoint(sharded):
    path, _, _ = sharded
    manifest = json.loads((path / ckpt.MANIFEST).read_text())
    manifest["files"]["../config.json"] = manifest["files"][ckpt.CONFIG]
    (path / ckpt.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"\.\./config\.json is missing"):
        ckpt.verify(path)


def test_parallel_is_checked_where_it_is_read():
    assert load_config(preset="tiny", sets=["parallel=fsdp"])[0].parallel == "fsdp"
    assert load_config(preset="tiny")[0].parallel == "ddp"
    with pytest.raises(ConfigError, match="parallel must be ddp or fsdp, got 'zero3'"):
        load_config(preset="tiny", sets=["parallel=zero3"])


def test_a_lost_peer_is_told_from_other_errors():
    gloo = RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:50395: "
                        "Connection reset by peer. This is typically caused by a remote worker hanging")
    assert lost_peer(gloo) and lost_peer(dist.DistBackendError("NCCL communicator was aborted"))
    wrapped = ValueError("while saving")
    wrapped.__cause__ = gloo
    gathered = CheckpointException("save failed", {1: _wrap_exception(gloo)})  # torch.distributed.checkpoint's
    assert lost_peer(wrapped) and lost_peer(gathered)
    assert not lost_peer(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) and not lost_peer(OSError(28, "x"))


def test_a_planted_pickle_never_runs_through_the_real_commands(tmp_path):
    """The campaign's case through `lumen` itself: a sharded run (parallel = fsdp, one process) whose index marks an
    entry as bytes, its manifest rewritten to match (as whoever planted it would). `train --resume`, `generate` and
    `convert` each refuse it in one line, exit 2, and the planted pickle never runs."""
    import os
    import subprocess
    import sys

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"to be and {w}, said the {n}th voice;\n" for n, w in enumerate(["more", "less"] * 90)))
    run = tmp_path / "run"
    sets = [f"corpus='{corpus}'", f"out_dir='{run}'", "parallel=fsdp", "progress=false", "dtype=float32",
            "threads=1", "eval_interval=2", "sample_tokens=0", "eval_windows=2", "batch_size=2", "model.context=16"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LUMEN_OFFLINE": "1"}

    def lumen(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "lumen", *args], env=env, capture_output=True, text=True,
                              timeout=300)

    def train(steps: int, *more: str) -> subprocess.CompletedProcess:
        return lumen("train", "--preset", "tiny", *(f"--set={s}" for s in [*sets, f"steps={steps}"]), *more)

    done = train(2)
    assert done.returncode == 0, done.stderr[-2000:]
    step = run / "checkpoints" / "step-000002"
    witness = tmp_path / "ran"
    plant_bytes_entry(step, witness)
    ckpt.write_manifest(step)  # the manifest agrees with the planted files
    for done in (train(4, "--resume"), lumen("generate", str(run), "--prompt", "to", "--max-new-tokens", "2"),
                 lumen("convert", str(run), str(tmp_path / "hf"), "--to", "hf")):
        assert not witness.exists(), done.args
        assert done.returncode == 2, (done.args, done.stderr[-2000:])
        assert "Traceback" not in done.stderr and "not a tensor" in done.stderr, done.stderr[-2000:]
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


# ---------------------------------------------------------------------------------------------------------------
# damaged sharded runs through the real command (issue 38): `lumen generate RUN` and `lumen train --resume`, in this
# process as the `lumen` script runs them. The reference: the run's own undisturbed end (step 6), which a resume from
# any intact checkpoint reaches bit for bit, so a damaged checkpoint used quietly shows up.

RUN_SETS = ["parallel=fsdp", "progress=false", "dtype=float32", "threads=1", "eval_interval=2", "sample_tokens=0",
            "eval_windows=2", "batch_size=2", "model.context=16", "keep_last=10", "steps=6"]


def lumen_main(capsys, *argv: str, seconds: int = 60) -> tuple[int, str]:
    """(exit code, stderr) of the real command; past `seconds` it is a hang (a FIFO opened for reading waits)."""
    import signal

    from lumen.cli import main

    def hung(signum, frame):
        raise TimeoutError(f"lumen {' '.join(argv[:2])} hung")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        code = main(list(argv))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory):
    """A sharded run (parallel = fsdp, one process) as a kill leaves it at step 4 (checkpoints 2 and 4, best.json
    naming 4), the weights its undisturbed end has, and another run of the same shapes (seed 7)."""
    from lumen.cli import main
    from lumen.train.rundir import RunDir

    root = tmp_path_factory.mktemp("sharded-run")
    corpus = root / "corpus.txt"
    corpus.write_text("".join(f"to be and {w}, said the {n}th voice;\n" for n, w in enumerate(["more", "less"] * 90)))
    sets = [f"corpus='{corpus}'", *RUN_SETS]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RunDir, "plot", lambda *a, **k: None)  # (the loss plot is most of a tiny run's time)
        for out, more in ((root / "full", []), (root / "other", ["seed=7"])):
            assert main(["train", "--preset", "tiny", *(f"--set={s}" for s in [*sets, f"out_dir='{out}'", *more])]) == 0
    killed = root / "killed"
    shutil.copytree(root / "full", killed)
    shutil.rmtree(killed / "checkpoints" / "step-000006")
    (killed / "summary.json").unlink()
    (killed / "best.json").write_text(json.dumps({"checkpoint": "step-000004", "val_loss": 3.0}))
    return killed, ckpt.read_sharded_state(root / "full" / "checkpoints" / "step-000006"), root / "other", sets


def step(run, n: int):
    return run / "checkpoints" / f"step-{n:06d}"


def resume(capsys, run, sets) -> tuple[int, str]:
    from lumen.train.rundir import RunDir

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RunDir, "plot", lambda *a, **k: None)
        return lumen_main(capsys, "train", "--preset", "tiny", *(f"--set={s}" for s in [*sets, f"out_dir='{run}'"]),
                          "--resume")


def generate(capsys, run) -> tuple[int, str]:
    return lumen_main(capsys, "generate", str(run), "--prompt", "to", "--max-new-tokens", "2", "--greedy")


def flip(path, at: int) -> None:
    b = bytearray(path.read_bytes())
    b[at % len(b)] ^= 0x10
    path.write_bytes(bytes(b))


def mkfifo(path) -> None:
    import os

    path.unlink()
    os.mkfifo(path)


SHARD = "shards/__0_0.distcp"
# each: what it does to the run (step-4 is the best and the newest), and what the one line must name
DAMAGE = {
    "bit-flipped shard": (lambda run, other: flip(step(run, 4) / SHARD, 5000), "__0_0.distcp is damaged"),
    "shard of another run": (lambda run, other: shutil.copy(step(other, 4) / SHARD, step(run, 4) / SHARD),
                             "__0_0.distcp is damaged"),
    "index missing": (lambda run, other: (step(run, 4) / ckpt.SHARD_INDEX).unlink(), ".metadata is missing"),
    "shard a FIFO": (lambda run, other: mkfifo(step(run, 4) / SHARD), "__0_0.distcp is a FIFO"),
    "manifest a FIFO": (lambda run, other: mkfifo(step(run, 4) / ckpt.MANIFEST), "manifest.json is a FIFO"),
    # put together from two checkpoints, the manifest rewritten to match (as whoever did it would)
    "shard of step 2, manifest rewritten": (
        lambda run, other: (shutil.copy(step(run, 2) / SHARD, step(run, 4) / SHARD), ckpt.write_manifest(step(run, 4))),
        "__0_0.distcp belongs to another checkpoint"),
    "index of step 2, manifest rewritten": (
        lambda run, other: (shutil.copy(step(run, 2) / ckpt.SHARD_INDEX, step(run, 4) / ckpt.SHARD_INDEX),
                            ckpt.write_manifest(step(run, 4))), ".metadata belongs to another checkpoint"),
    "trainer.pt of step 2, manifest rewritten": (
        lambda run, other: (shutil.copy(step(run, 2) / ckpt.TRAINER, step(run, 4) / ckpt.TRAINER),
                            ckpt.write_manifest(step(run, 4))), "trainer.pt belongs to another checkpoint"),
    "damaged index, manifest rewritten": (
        lambda run, other: (flip(step(run, 4) / ckpt.SHARD_INDEX, 300), ckpt.write_manifest(step(run, 4))),
        ".metadata is damaged"),
    "trainer.pt of objects torch will not build, manifest rewritten": (
        lambda run, other: (torch.save({"when": __import__("datetime").date(2026, 1, 1)}, step(run, 4) / ckpt.TRAINER),
                            ckpt.write_manifest(step(run, 4))),
        "trainer.pt is damaged (not tensors torch reads safely: Unsupported global: GLOBAL datetime.date"),
    "garbage trainer.pt, manifest rewritten": (
        lambda run, other: ((step(run, 4) / ckpt.TRAINER).write_bytes(b"PK\x03\x04" + bytes(200)),
                            ckpt.write_manifest(step(run, 4))), "trainer.pt is damaged"),
}


@pytest.mark.parametrize("what", list(DAMAGE))
def test_a_damaged_best_checkpoint_is_named_not_read(sharded_run, tmp_path, capsys, what):
    """`lumen generate RUN` whose best (and newest) checkpoint is damaged: one line naming the damaged file, exit 2;
    never a quiet read of step 2 (the older one) or a wait on a FIFO; and no torch advice or traceback."""
    killed, _, other, _ = sharded_run
    run = tmp_path / "run"
    shutil.copytree(killed, run)
    damage, named = DAMAGE[what]
    damage(run, other)
    code, err = generate(capsys, run)
    assert code == 2 and len(err.strip().splitlines()) == 1 and named in err, err
    assert "Traceback" not in err and "weights_only" not in err.lower() and "settings" not in err, err


@pytest.mark.parametrize("what", list(DAMAGE))
def test_resume_passes_over_a_damaged_sharded_checkpoint(sharded_run, tmp_path, capsys, what):
    """`lumen train --resume` names the damaged checkpoint in one line and resumes from step 2, ending with the
    undisturbed run's weights, bit for bit (so nothing of the damaged one was used)."""
    killed, reference, other, sets = sharded_run
    run = tmp_path / "run"
    shutil.copytree(killed, run)
    damage, named = DAMAGE[what]
    damage(run, other)
    code, err = resume(capsys, run, sets)
    said = [line for line in err.splitlines() if "damaged" in line or "another checkpoint" in line]
    assert code == 0 and len(said) == 1 and named in said[0] and "resuming from step-000002" in said[0], err
    assert "Traceback" not in err and "weights_only" not in err.lower(), err
    got = ckpt.read_sharded_state(step(run, 6))
    assert got.keys() == reference.keys() and all(torch.equal(got[k], reference[k]) for k in got)


def test_a_damaged_best_json_is_said_so(sharded_run, tmp_path, capsys):
    killed, _, _, _ = sharded_run
    run = tmp_path / "run"
    shutil.copytree(killed, run)
    for damaged, said in (("{", "best.json is damaged"), ('{"checkpoint": "../../x"}', "best.json is damaged"),
                          ('{"checkpoint": "step-000009"}', "best.json names step-000009, which is gone")):
        (run / "best.json").write_text(damaged)
        code, err = generate(capsys, run)
        assert code == 0 and said in err.splitlines()[0] and "names no best one" not in err, err
    mkfifo(run / "best.json")
    code, err = generate(capsys, run)
    assert code == 0 and "best.json is a FIFO" in err.splitlines()[0], err


@pytest.mark.slow
def test_each_rank_file_carries_the_checkpoint_id(sharded_run, tmp_path):
    """Two processes (torchrun, gloo): each rank's shard file carries the checkpoint's id, so rank 1's file of step 2
    put into step 4 (the manifest rewritten to match) is refused, naming it; the checkpoint as written loads."""
    import os
    import subprocess
    import sys

    _, _, _, sets = sharded_run
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "lumen", "train",
           "--preset", "tiny", *(f"--set={s}" for s in [*sets, f"out_dir='{run}'", "steps=4", "grad_accum=2"])]
    done = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1", "LUMEN_OFFLINE": "1"}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for n in (2, 4):
        assert sorted(p.name for p in (step(run, n) / "shards").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
        ckpt.verify(step(run, n))
    assert ckpt.read_sharded_state(step(run, 4)).keys() >= {"tok_emb.weight"}
    shutil.copy(step(run, 2) / "shards" / "__1_0.distcp", step(run, 4) / "shards" / "__1_0.distcp")
    ckpt.write_manifest(step(run, 4))
    with pytest.raises(CheckpointError, match=r"__1_0\.distcp belongs to another checkpoint"):
        ckpt.read_sharded_state(step(run, 4))
