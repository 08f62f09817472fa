"""lumen against nanoGPT on the same split, the same minutes and one evaluator. nanoGPT is not part of
lumen: clone it anywhere (github.com/karpathy/nanoGPT) and point this script at it.

    # 1. lumen's character split as a nanoGPT dataset (train.bin, val.bin, meta.pkl)
    .venv/bin/python bench/vs_nanogpt.py export NANOGPT/data/lumen_char
    # 2. train nanoGPT for five minutes' worth of steps (its speed here: `speed`, below), e.g.
    #    cd NANOGPT && python train.py config/train_shakespeare_char.py --dataset=lumen_char --device=cpu \\
    #      --compile=False --n_layer=4 --n_head=4 --n_embd=256 --block_size=128 --batch_size=24 --dropout=0.0 \\
    #      --max_iters=STEPS --lr_decay_iters=STEPS --eval_interval=STEPS --out_dir=out-lumen
    .venv/bin/python bench/vs_nanogpt.py speed NANOGPT        # its training tokens/s, interleaved with lumen's
    # 3. both models through one evaluator: every token of the held-out works, nats per character
    .venv/bin/python bench/vs_nanogpt.py eval NANOGPT NANOGPT/out-lumen runs/shakespeare

and, to tell the machine from lumen when the main job runs slower on one CPU than on another: the main job's step
and nanoGPT's CPU recipe's step, each in a process of its own, on this CPU's instruction set and as an AVX2-only
CPU runs them (common.AVX2_STAND_IN), taking turns:

    .venv/bin/python bench/vs_nanogpt.py isa NANOGPT

`eval` and `isa` write their tables to docs/speed/nanogpt.json and train_isa.json (bench/results.py), which
bench/speed_doc.py renders into docs/speed.md.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from common import AVX2_STAND_IN, timed  # (this script's folder is on sys.path)
from lumen.data import TokenData, prepare
from results import Record


def export(out: Path) -> None:
    """lumen's character-level Shakespeare split in nanoGPT's dataset format."""
    data = prepare("shakespeare", "char")
    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val"):
        data.tokens(split).astype(np.uint16).tofile(out / f"{split}.bin")
    chars = data.tokenizer.chars
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": {c: i for i, c in enumerate(chars)}}
    (out / "meta.pkl").write_bytes(pickle.dumps(meta))  # nanoGPT reads its vocabulary size from this
    print(f"wrote {out}: {len(data.tokens('train')):,} train and {len(data.tokens('val')):,} validation characters")


@torch.no_grad()
def nats_per_char(forward, data: TokenData, context: int) -> float:
    """Every token of the validation split scored once, in non-overlapping windows of `context`; total
    nats over the characters those targets spell (the end-of-text token spells none)."""
    ids = torch.from_numpy(data.tokens("val").astype(np.int64))
    total = 0.0
    for start in range(0, len(ids) - 1, context):
        window = ids[start : start + context + 1][None]
        logits = forward(window[:, :-1])
        total += torch.nn.functional.cross_entropy(logits[0].float(), window[0, 1:], reduction="sum").item()
    eos = data.tokenizer.eos_id
    return total / len(data.tokenizer.decode([int(i) for i in ids[1:] if i != eos]))


def nanogpt(repo: Path):
    sys.path.insert(0, str(repo))
    from model import GPT, GPTConfig  # nanoGPT's model.py

    return GPT, GPTConfig


def evaluate(repo: Path, ckpt_dir: Path, run_dir: Path) -> None:
    from lumen.formats import load
    from lumen.formats.checkpoint import META, resolve
    from lumen.train.config import load_config

    GPT, GPTConfig = nanogpt(repo)
    ck = torch.load(ckpt_dir / "ckpt.pt", map_location="cpu", weights_only=True)
    theirs = GPT(GPTConfig(**ck["model_args"]))
    theirs.load_state_dict(ck["model"])
    theirs.eval()
    logits_of = lambda x: theirs(x, x)[0]  # noqa: E731  (given targets, nanoGPT returns every position's logits)
    theirs_nats = nats_per_char(logits_of, prepare('shakespeare', 'char'), ck['model_args']['block_size'])
    print(f"nanoGPT {ckpt_dir} (iter {ck['iter_num']}): {theirs_nats:.4f} nats/char")
    ours = load(run_dir).model
    cfg, _ = load_config(str(run_dir / "config.toml"))
    ours_nats = nats_per_char(lambda x: ours(x)[0], cfg.prepare_data(), ours.cfg.context)
    print(f"lumen {run_dir}: {ours_nats:.4f} nats/char")
    with Record("nanogpt") as rec:
        a, c = ck["model_args"], ck.get("config", {})
        per_step = c.get("batch_size", 0) * c.get("gradient_accumulation_steps", 1) * a["block_size"]
        meta = json.loads((resolve(run_dir) / META).read_text())
        rec["rows"] = [
            {"run": f"nanoGPT, characters, {a['n_layer']}x{a['n_embd']}, fp32", "steps": ck["iter_num"],
             "tokens": ck["iter_num"] * per_step or None, "nats_per_char": theirs_nats},
            {"run": f"lumen `{run_dir}` ({ours.cfg.n_layers}x{ours.cfg.d_model}, vocabulary {ours.cfg.vocab_size})",
             "steps": meta.get("step"), "tokens": meta.get("tokens"), "nats_per_char": ours_nats}]


def speed(repo: Path, rounds: int = 4, steps: int = 3) -> None:
    """Training tokens/s of nanoGPT's 4x256 character model (fp32, its own optimizer) and lumen's at the same
    shape (fp32 and bf16), interleaved so that a busy machine slows all alike; best of `rounds`."""
    from lumen import GPT as Lumen
    from lumen import ModelConfig
    from lumen.train.optim import make_optimizer

    GPT, GPTConfig = nanogpt(repo)
    L, D, H, T, B, V = 4, 256, 4, 128, 24, 84
    torch.manual_seed(0)
    theirs = GPT(GPTConfig(block_size=T, vocab_size=V, n_layer=L, n_head=H, n_embd=D, dropout=0.0, bias=True))
    ours = Lumen(ModelConfig(vocab_size=V, context=T, d_model=D, n_layers=L, n_heads=H))
    runs = {"nanoGPT fp32": (theirs, theirs.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu"), False),
            "lumen fp32": (ours, make_optimizer(ours, 1e-3, 0.1, (0.9, 0.99)), False)}
    runs["lumen bf16"] = (ours, runs["lumen fp32"][1], True)
    x, y = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))

    def step(model, opt, bf16: bool) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(x, y)[1]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    best = dict.fromkeys(runs, 0.0)
    for run in runs.values():
        step(*run)
    for _ in range(rounds):
        for name, run in runs.items():
            t = time.perf_counter()
            for _ in range(steps):
                step(*run)
            best[name] = max(best[name], steps * B * T / (time.perf_counter() - t))
    for name, tps in best.items():
        print(f"{name:<14}{tps:>8,.0f} tokens/s   five minutes = {300 * tps / (B * T):,.0f} steps of {B * T:,} tokens")


# nanoGPT's README's recipe for a CPU ("I only have a macbook"): 4x128, context 64, batch 12, fp32, not compiled
RECIPE = {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 64, "batch_size": 12, "vocab_size": 65}
CONTENDERS = {"nanogpt": "nanoGPT's CPU recipe (4x128, 12 x 64 tokens, fp32, eager)",
              "lumen-float32": "lumen's main job (4x128, 16 x 128 tokens, compiled), fp32",
              "lumen-bfloat16": "lumen's main job, bf16 autocast",
              "lumen-float32-bf16-muon": "lumen's main job, fp32, Muon's products as bf16 products (before 2026-12-05)"}


def step_time(contender: str, repo: Path | None, threads: int, steps: int) -> dict:
    """One contender's training step in this process: the median of `steps` timed steps after five that warm
    up (and compile), in seconds, with its tokens."""
    torch.set_num_threads(threads)
    if contender == "nanogpt":
        assert repo is not None
        GPT, GPTConfig = nanogpt(repo)
        r = RECIPE
        model = GPT(GPTConfig(block_size=r["block_size"], vocab_size=r["vocab_size"], n_layer=r["n_layer"],
                              n_head=r["n_head"], n_embd=r["n_embd"], dropout=0.0, bias=False))
        opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
        shape = (r["batch_size"], r["block_size"])

        def one() -> None:
            x, y = torch.randint(0, r["vocab_size"], shape), torch.randint(0, r["vocab_size"], shape)
            model(x, y)[1].backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

        return {"seconds": _median_step(one, steps), "tokens": shape[0] * shape[1]}
    from lumen.train.config import load_config
    from lumen.train.loop import Trainer
    from lumen.train.machine import run_settings, use_bf16

    dtype = contender.removeprefix("lumen-").removesuffix("-bf16-muon")
    if contender.endswith("-bf16-muon"):  # Newton-Schulz's products as torch's bf16 products, whatever the CPU
        from lumen.train import optim

        optim.orthogonalize = functools.partial(optim.orthogonalize, bf16_products=True)
    cfg, model_cfg = load_config(preset="shakespeare", sets=["time_budget=0", "save=false", "progress=false",
                                                             f"dtype={dtype}", f"threads={threads}"])
    with run_settings(cfg):
        trainer = Trainer(cfg, model_cfg, None)
        return {"seconds": _median_step(trainer.train_step, steps), "tokens": cfg.windows_per_step * trainer.T,
                # (the step `make` takes here: the dtype "auto" chooses, Muon's products as optim chooses)
                "main_jobs_dtype": use_bf16("auto", trainer.device) == (dtype == "bfloat16")
                and not contender.endswith("-bf16-muon")}


def _median_step(one, steps: int) -> float:
    for _ in range(5):  # (the first compile and warm the caches)
        one()
    return timed(one, steps)[0]


def isa(repo: Path, rounds: int, steps: int, threads: list[int]) -> None:
    """Each contender's step on this CPU's instruction set and on AVX2 only, each in a process of its own,
    taking turns; the best round of each."""
    if not (repo / "model.py").exists():
        print(f"vs_nanogpt.py: {repo} holds no nanoGPT (no model.py); clone github.com/karpathy/nanoGPT there",
              file=sys.stderr)
        sys.exit(2)
    isas = {"native": {}, "avx2": AVX2_STAND_IN}
    best: dict[tuple[str, str, int], dict] = {}
    with Record("train_isa") as rec:
        for r, name, contender, t in itertools.product(range(rounds), isas, CONTENDERS, threads):
            out = subprocess.run([sys.executable, __file__, "step", contender, "--nanogpt", str(repo), "--threads",
                                  str(t), "--steps", str(steps)], env=os.environ | isas[name], capture_output=True,
                                 text=True)
            if out.returncode:
                sys.exit(f"{contender} ({name}, {t} threads) failed:\n{out.stderr[-2000:]}")
            got = json.loads(out.stdout.splitlines()[-1])
            key = (name, contender, t)
            if key not in best or got["seconds"] < best[key]["seconds"]:
                best[key] = got
            print(f"round {r + 1}: {name:<6} {contender:<15} {t} thread(s): {1e3 * got['seconds']:7.1f} ms a step, "
                  f"{got['tokens'] / got['seconds']:8,.0f} tok/s", file=sys.stderr)
        rec.update(rounds=rounds, steps=steps, threads=threads, contenders=CONTENDERS, isas=list(isas), rows=[
            {"isa": i, "contender": c, "threads": t, **best[(i, c, t)]} for (i, c, t) in best])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("export").add_argument("out", type=Path)
    sp = sub.add_parser("speed")
    sp.add_argument("nanogpt", type=Path)
    ev = sub.add_parser("eval")
    for name in ("nanogpt", "ckpt_dir", "run_dir"):
        ev.add_argument(name, type=Path)
    ia = sub.add_parser("isa")
    ia.add_argument("nanogpt", type=Path)
    ia.add_argument("--rounds", type=int, default=3)
    ia.add_argument("--steps", type=int, default=20, help="steps timed in each process (default 20)")
    ia.add_argument("--threads", default="1,2", help="thread counts (default 1,2)")
    st = sub.add_parser("step")  # one contender's step, in its own process (isa runs it)
    st.add_argument("contender", choices=list(CONTENDERS))
    st.add_argument("--nanogpt", type=Path)
    st.add_argument("--threads", type=int, default=1)
    st.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    if args.cmd == "isa":
        isa(args.nanogpt, args.rounds, args.steps, [int(t) for t in args.threads.split(",")])
    elif args.cmd == "step":
        print(json.dumps(step_time(args.contender, args.nanogpt, args.threads, args.steps)))
    elif args.cmd == "export":
        export(args.out)
    elif args.cmd == "speed":
        speed(args.nanogpt)
    else:
        evaluate(args.nanogpt, args.ckpt_dir, args.run_dir)


if __name__ == "__main__":
    main()
