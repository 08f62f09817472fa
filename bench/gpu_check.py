"""lumen on a CUDA GPU, checked in one run of a few minutes (bench/gpu_check.sh runs it; it skips in one line
without a CUDA device). Each check prints one line, PASS or FAIL with its numbers; the exit code is the number
of failures.

    .venv/bin/python bench/gpu_check.py [--device cuda:0] [--only parity,train,fsdp,decode,inspect,blocks]
    .venv/bin/python bench/gpu_check.py --device cpu     # a rehearsal of the same code on the CPU, small shapes

  parity   every Hugging Face family (GPT-2, Llama, Qwen2, Mistral, Gemma, GPT-NeoX) on random weights: lumen's
           logits against transformers' on the device, float32 (to 1e-4) and bf16 (lumen's error against the
           float32 logits at most 4x transformers' own bf16 error + 5e-3: lumen's norms compute in bf16 where
           transformers' upcast to float32, so Gemma's error is ~2.4x on CPU; a wrong weight is off by far more)
  train    one compiled bf16 training step of a GPT-2-small shape, as lumen's loop takes it: tokens/s, and MFU
           against the device's measured bf16 matmul peak and against its data sheet's dense bf16 peak
  fsdp     `lumen train` on the device (bf16 autocast), then `torchrun --nproc_per_node=1 ... parallel=fsdp`
           (NCCL), resumed, and its sharded checkpoint loaded back (one GPU: the sharding itself is tested on CPU)
  decode   a SmolLM2-shaped model (random weights) read from a run directory by lumen.formats.load onto the
           device in bf16: eager and compiled greedy decoding agree (or part at a near tie), tokens/s of each
  inspect  the logit lens and direct logit attribution on the device against the CPU's, float32
  blocks   a GGUF's Q8_0/Q4_1 blocks (lumen.fast.load_quantized) on the device: which product runs, and its numbers
           against the CPU's and against the dequantized float model
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
CHECKS = ("parity", "train", "fsdp", "decode", "inspect", "blocks")

# dense bf16 tensor-core peaks from NVIDIA's data sheets (TFLOP/s, without sparsity), by device name
# (torch's names: "NVIDIA H100 80GB HBM3" is the SXM part; NVL parts, clocked lower, are left out)
DATASHEET_BF16_TFLOPS = {"H200": 989.0, "H100 PCIe": 756.0, "H100 80GB HBM3": 989.0, "A100": 312.0, "L40S": 362.0,
                         "L40": 181.0, "L4": 121.0}

failures: list[str] = []


def report(name: str, ok: bool, detail: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    if not ok:
        failures.append(name)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def big(device: torch.device) -> bool:
    """Full-size shapes on a GPU; small ones for a CPU rehearsal."""
    return device.type == "cuda"


# --- parity -------------------------------------------------------------------------------------------
def hf_models() -> dict:
    """A small random transformers model of every family lumen reads (GQA where the family has it)."""
    import transformers as tf

    V = 97
    return {
        "gpt2": lambda: tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=V, n_embd=64, n_layer=2, n_head=4, n_positions=48)),
        "llama": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(
            vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=48)),
        "qwen2": lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(
            vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=48)),
        "mistral": lambda: tf.MistralForCausalLM(tf.MistralConfig(
            vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=48, sliding_window=5)),
        "gemma": lambda: tf.GemmaForCausalLM(tf.GemmaConfig(
            vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=1, head_dim=32, max_position_embeddings=48)),
        "gpt_neox": lambda: tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(
            vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=48, rotary_pct=0.25, hidden_act="gelu")),
    }


@torch.no_grad()
def check_parity(device: torch.device) -> None:
    try:
        import transformers
    except ImportError:
        report("parity", False, "transformers is not installed (pip install -e '.[dev]')")
        return
    from lumen.formats.hf import from_hf_model

    transformers.utils.logging.set_verbosity_error()
    ids = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(0)).to(device)
    for family, build in hf_models().items():
        torch.manual_seed(0)
        hf = build().eval()
        with torch.no_grad():  # norms and biases away from their init, so that a misplaced one shows
            for p in hf.parameters():
                if p.dim() == 1:
                    p.add_(torch.randn_like(p) * 0.1)
        ours = from_hf_model(hf).eval()
        hf, ours = hf.to(device), ours.to(device)
        reference = hf(ids).logits.float()
        fp32 = (ours(ids)[0].float() - reference).abs().max().item()
        hf_bf16 = (hf.to(torch.bfloat16)(ids).logits.float() - reference).abs().max().item()
        ours_bf16 = (ours.to(torch.bfloat16)(ids)[0].float() - reference).abs().max().item()
        ok = fp32 < 1e-4 and ours_bf16 <= 4 * hf_bf16 + 5e-3
        report(f"parity {family}", ok, f"float32 max |lumen - transformers| {fp32:.1e}; bf16 error against the "
                                      f"float32 logits: lumen {ours_bf16:.1e}, transformers {hf_bf16:.1e}")


# --- a training step ------------------------------------------------------------------------------------
def datasheet_peak(device: torch.device) -> tuple[str, float | None]:
    if device.type != "cuda":
        return "cpu", None
    name = torch.cuda.get_device_name(device)
    for key, tflops in DATASHEET_BF16_TFLOPS.items():  # the more specific names first
        if key in name and "NVL" not in name:
            return name, tflops * 1e12
    return name, None


def check_train(device: torch.device) -> None:
    sys.path.insert(0, str(REPO / "bench"))
    from bench_train import contender  # lumen's step as its training loop takes it (bench/bench_train.py)
    from lumen.train.speed import matmul_peak, training_flops_per_token

    shape = dict(layers=12, d_model=768, context=1024, batch=8, vocab=50304) if big(device) else \
        dict(layers=2, d_model=128, context=64, batch=2, vocab=512)
    args = argparse.Namespace(**shape, device=str(device), threads=0)
    cfg, step = contender("lumen", True, True, args)
    t0 = time.perf_counter()
    for _ in range(3):  # compiles, then the optimizer's state and the allocator settle
        step()
    sync(device)
    compile_s = time.perf_counter() - t0
    steps = 10 if big(device) else 3
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    tok_s = steps * args.batch * args.context / (time.perf_counter() - t0)
    flops = tok_s * training_flops_per_token(cfg, args.context)
    measured = matmul_peak(device, torch.bfloat16, n=8192 if big(device) else 1024)
    name, sheet = datasheet_peak(device)
    mem = f", peak memory {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB" if device.type == "cuda" else ""
    sheet_txt = f"{flops / sheet:.0%} of the data sheet's {sheet / 1e12:.0f}" if sheet else "no data-sheet peak known"
    report("train bf16 step", math.isfinite(tok_s) and tok_s > 0,
           f"{name}: GPT-2 shape {args.layers}x{args.d_model}, context {args.context}, batch {args.batch}, "
           f"compiled: {tok_s:,.0f} tokens/s, {flops / 1e12:.1f} TFLOP/s = MFU {flops / measured:.0%} of the "
           f"measured bf16 matmul peak ({measured / 1e12:.0f} TFLOP/s), {sheet_txt} TFLOP/s; first 3 steps "
           f"{compile_s:.0f} s{mem}")


# --- lumen train and FSDP under torchrun ------------------------------------------------------------------
def check_fsdp(device: torch.device) -> None:
    from lumen.formats import checkpoint as ckpt
    from lumen.formats import load

    env = {**os.environ, "LUMEN_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    sets = ["corpus='docs/architecture.md'", "tokenizer='char'", "steps=20", "eval_interval=10", "eval_windows=8",
            "sample_tokens=20", "progress=false", f"device='{device}'", "dtype='auto'", "compile=false",
            "model.n_layers=2", "model.d_model=64", "model.n_heads=2", "model.context=64", "batch_size=8"]
    with tempfile.TemporaryDirectory() as tmp:
        def train(out: str, *extra: str, torchrun: bool = False, resume: bool = False) -> subprocess.CompletedProcess:
            cmd = [sys.executable, "-m", "lumen", "train", *(f"--set={s}" for s in [*sets, f"out_dir={out}", *extra])]
            if torchrun:
                cmd[1:2] = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", "-m"]
            return subprocess.run(cmd + (["--resume"] if resume else []), cwd=REPO, env=env, capture_output=True,
                                  text=True, timeout=600)

        one = train(f"{tmp}/one")
        summary = json.loads(Path(tmp, "one", "summary.json").read_text()) if one.returncode == 0 else {}
        report("fsdp lumen train", one.returncode == 0 and summary.get("device", "").startswith(device.type),
               f"20 steps on {summary.get('device')}, bf16 {summary.get('bf16')}, final val loss "
               f"{summary.get('final_val_loss')}" if one.returncode == 0 else one.stderr.strip()[-600:])
        # (AdamW: the preset's Muon orthogonalises whole matrices, which FSDP splits between processes)
        fsdp = ("parallel='fsdp'", "optimizer='adamw'")
        sharded = train(f"{tmp}/fsdp", *fsdp, "steps=10", torchrun=True)
        resumed = train(f"{tmp}/fsdp", *fsdp, torchrun=True, resume=True) if sharded.returncode == 0 else sharded
        if resumed.returncode != 0:
            report("fsdp torchrun", False, resumed.stderr.strip()[-600:])
            return
        path = ckpt.latest_checkpoint(f"{tmp}/fsdp")
        assert path is not None
        model = load(f"{tmp}/fsdp", device=device).model
        x = torch.tensor([[1, 2, 3, 4]], device=device)
        finite = bool(torch.isfinite(model(x)[0]).all())
        report("fsdp torchrun", ckpt.is_sharded(path) and ckpt.step_of(path) == 20 and finite,
               f"1 process ({'nccl' if device.type == 'cuda' else 'gloo'}), 10 steps, resumed to 20: {path.name} "
               f"holds {sorted(p.name for p in (path / ckpt.SHARDS).iterdir())}, loaded back onto {device}")


# --- decoding --------------------------------------------------------------------------------------------
@torch.no_grad()
def check_decode(device: torch.device) -> None:
    from lumen import GPT, fast
    from lumen.formats import checkpoint as ckpt
    from lumen.formats import load

    torch.manual_seed(0)
    preset = dict() if big(device) else dict(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=128)
    model = GPT.from_preset("smollm2-135m", **preset)
    with torch.no_grad():  # peakier distributions than a fresh init's, so that greedy choices are clear
        model.lm_head.weight.mul_(30)
    n = 64 if big(device) else 16
    with tempfile.TemporaryDirectory() as tmp:
        ckpt.save_checkpoint(Path(tmp, "step-000001"), model)
        loaded = load(str(Path(tmp, "step-000001")), device=device, dtype=torch.bfloat16).model
    prompt = torch.randint(0, model.cfg.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1)).to(device)
    runs = {}
    for compiled in (False, True):
        if compiled:  # the first call compiles (the same length: the same graphs)
            fast.generate(loaded, prompt, n, temperature=0, compile=True)
        sync(device)
        t0 = time.perf_counter()
        out = fast.generate(loaded, prompt, n, temperature=0, compile=compiled)  # lumen generate's door
        sync(device)
        runs[compiled] = (out[0, 16:], n / (time.perf_counter() - t0))
    eager, compiled_out = runs[False][0], runs[True][0]
    same = int((eager == compiled_out).cumprod(0).sum())
    ok, where = same == n, ""
    if not ok:  # parted: at that step, was the compiled choice as good as eager's, to bf16 rounding?
        logits = loaded(torch.cat([prompt[0], compiled_out])[None])[0][0, 16 + same - 1].float()
        gap = (logits.max() - logits[compiled_out[same]]).item()
        ok = gap <= 0.05 * logits.abs().max().item()
        where = f", parted at token {same} where eager's logit lead is {gap:.3f}"
    report("decode compiled", ok, f"SmolLM2 shape, bf16 on {device}: {same}/{n} greedy tokens as eager{where}; "
                                  f"eager {runs[False][1]:.0f} tokens/s, compiled {runs[True][1]:.0f} tokens/s")


# --- lens and attribution --------------------------------------------------------------------------------
@torch.no_grad()
def check_inspect(device: torch.device) -> None:
    from lumen import GPT
    from lumen.inspect import logit_lens
    from lumen.inspect.attribution import attribute

    torch.manual_seed(0)
    model = GPT.from_preset("baby-llama", n_layers=3, d_model=64, n_heads=4, n_kv_heads=2, vocab_size=300,
                            context=64).eval()
    ids = torch.randint(0, 300, (1, 24), generator=torch.Generator().manual_seed(2))
    cpu_lens, cpu_attr = logit_lens(model, ids), attribute(model, ids, target=7)
    model.to(device)
    lens, attr = logit_lens(model, ids.to(device)), attribute(model, ids.to(device), target=7)
    d_lens = (lens.top_probs.cpu() - cpu_lens.top_probs).abs().max().item()
    d_kl = (lens.kl.cpu() - cpu_lens.kl).abs().max().item()
    d_attr = (attr.values.cpu() - cpu_attr.values).abs().max().item()
    sums = (attr.values.sum(0).cpu() - attr.logit.cpu()).abs().max().item()
    ok = d_lens < 1e-4 and d_kl < 1e-4 and d_attr < 1e-4 and sums < 1e-4  # (random weights: near ties in the top 5)
    report("inspect lens+attribution", ok, f"{device} against cpu, float32: lens top-5 probabilities "
                                          f"{d_lens:.1e}, KL {d_kl:.1e}; attribution {d_attr:.1e}, its sum "
                                          f"against the logit {sums:.1e}")


# --- GGUF blocks ------------------------------------------------------------------------------------------
def write_gguf(path: Path, model) -> None:
    """model (a Llama-family lumen GPT) as a GGUF file with Q8_0 attention and Q4_1 MLP matrices, the way
    llama.cpp's converter writes them (W_Q/W_K rows interleaved per head) and a byte-level vocabulary."""
    import numpy as np
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFWriter, quants
    from tokenizers.pre_tokenizers import ByteLevel

    cfg = model.cfg
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(cfg.n_layers)
    w.add_context_length(cfg.context)
    w.add_embedding_length(cfg.d_model)
    w.add_feed_forward_length(cfg.hidden)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.kv_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_vocab_size(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    tokens = sorted(ByteLevel.alphabet())
    w.add_token_list(tokens + [f"<extra{i}>" for i in range(cfg.vocab_size - len(tokens))])
    w.add_token_merges([])
    sd = {k: v.float().numpy() for k, v in model.state_dict().items()}

    def interleave(t: np.ndarray, heads: int) -> np.ndarray:
        out, d_in = t.shape
        return t.reshape(heads, 2, out // heads // 2, d_in).swapaxes(1, 2).reshape(out, d_in)

    tensors = {"token_embd.weight": (sd["tok_emb.weight"], Q.Q8_0), "output_norm.weight": (sd["ln_f.g"], Q.F32)}
    names = {"ln1.g": ("attn_norm.weight", Q.F32), "attn.q.weight": ("attn_q.weight", Q.Q8_0),
             "attn.k.weight": ("attn_k.weight", Q.Q8_0), "attn.v.weight": ("attn_v.weight", Q.Q8_0),
             "attn.out.weight": ("attn_output.weight", Q.Q8_0), "ln2.g": ("ffn_norm.weight", Q.F32),
             "mlp.w_gate.weight": ("ffn_gate.weight", Q.Q4_1), "mlp.w_up.weight": ("ffn_up.weight", Q.Q4_1),
             "mlp.w_down.weight": ("ffn_down.weight", Q.Q4_1)}
    for i in range(cfg.n_layers):
        for ours, (theirs, kind) in names.items():
            t = sd[f"blocks.{i}.{ours}"]
            if ours in ("attn.q.weight", "attn.k.weight"):
                t = interleave(t, cfg.n_heads if ours == "attn.q.weight" else cfg.kv_heads)
            tensors[f"blk.{i}.{theirs}"] = (t, kind)
    for name, (t, kind) in tensors.items():
        t = np.ascontiguousarray(t)
        if kind == Q.F32:
            w.add_tensor(name, t)
        else:
            w.add_tensor(name, quants.quantize(t, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@torch.no_grad()
def check_blocks(device: torch.device) -> None:
    from lumen import GPT, fast
    from lumen.fast import kernels
    from lumen.formats import load

    torch.manual_seed(0)
    model = GPT.from_preset("baby-llama", n_layers=2, d_model=128, n_heads=4, n_kv_heads=2, d_ff=256,
                            vocab_size=320, context=64)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "tiny.gguf")
        write_gguf(path, model)
        here = str(device)
        blocks = {where: fast.load_quantized(str(path), device=where).model for where in ("cpu", here)}
        dense = load(str(path), device=device).model  # the dequantized float32 model
    ids = torch.randint(0, 320, (1, 20), generator=torch.Generator().manual_seed(3))
    assert model.cfg.tie_embeddings  # the file's embedding blocks are its unembedding too
    many = (blocks[here](ids.to(device))[0] - dense(ids.to(device))[0]).abs().max().item()  # a prompt's rows
    one_row = {where: m(ids[:, :1].to(where))[0].float().cpu() for where, m in blocks.items()}  # a decoded token
    row = (one_row[here] - one_row["cpu"]).abs().max().item()
    on_device = blocks[here].lm_head.matrix.quads.device  # type: ignore[union-attr]
    kernel = "quant.cpp's kernel" if kernels.load() else "torch's formula (the kernel did not build here)"
    t0 = time.perf_counter()
    fast.generate(blocks[here], ids.to(device), 16, temperature=0)
    sync(device)
    tok_s = 16 / (time.perf_counter() - t0)
    path_text = ("torch's formula, QuantMatrix.rounded_row_product: quant.cpp's kernel is CPU-only "
                 "(QuantMatrix.row_product takes it only for a row on the CPU)") if device.type != "cpu" else kernel
    report("blocks gguf", on_device.type == device.type and many < 1e-3 and row < 1e-3,
           f"weights='gguf' on {device} keeps the blocks there ({on_device}); a decoded token's product runs "
           f"{path_text}: {row:.1e} from the CPU's ({kernel}); a prompt (dequantized slabs) {many:.1e} from the "
           f"float model; eager greedy decoding {tok_s:.0f} tokens/s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--only", default=",".join(CHECKS), help=f"a comma-separated subset of {', '.join(CHECKS)}")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: skipped: torch sees no CUDA device" + (
            f" (this torch, {torch.__version__}, is a CPU build: install a CUDA one)" if torch.version.cuda is None
            else ""))
        return 0
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    print(f"gpu_check: {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu (a rehearsal)'}, "
          f"torch {torch.__version__}, CUDA {torch.version.cuda}", flush=True)
    t0 = time.perf_counter()
    for name in args.only.split(","):
        if name not in CHECKS:
            print(f"gpu_check: unknown check {name!r}; choose from {', '.join(CHECKS)}")
            return 2
        try:
            globals()[f"check_{name}"](device)
        except Exception as e:  # noqa: BLE001 - one check failing must not hide the others
            report(name, False, f"{type(e).__name__}: {e}".splitlines()[0][:300])
            traceback.print_exc(file=sys.stderr)
    print(f"gpu_check: {len(failures)} failed ({', '.join(failures) or 'none'}) in {time.perf_counter() - t0:.0f} s")
    return len(failures)


if __name__ == "__main__":
    sys.exit(main())
