"""Where block decoding's peak memory comes from, step by step in one process (Linux: /proc/self/status).

    .venv/bin/python bench/decode_memory.py [aot|compiled|eager] [TOKENS]

After each step (import torch, import lumen, the GGUF header and tokenizer alone, load_quantized: header,
blocks and model, the decoding door, the first step: a package loaded or a graph compiled, TOKENS decoded
tokens), the resident memory now (VmRSS) and the high-water mark so far (VmHWM) in MiB, and whether the
compiler's Python (torch._dynamo, torch._inductor, sympy) has been imported yet. One
thread. Prints one line per step. Not a test.
"""

from __future__ import annotations

import sys
import warnings

from rss import status_kib  # bench/rss.py (the script's own folder is on sys.path)

COMPILER = ("torch._dynamo", "torch._inductor", "sympy")


def show(step: str) -> None:
    imported = ", ".join(m for m in COMPILER if m in sys.modules) or "-"
    print(f"{step:34s} VmRSS {status_kib('VmRSS') / 1024:5.0f}  VmHWM {status_kib('VmHWM') / 1024:5.0f}  "
          f"compiler imported: {imported}", flush=True)


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "aot"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    warnings.filterwarnings("ignore")
    show("start")
    import torch

    show("import torch")
    from lumen import fast
    from lumen.decode import GREEDY, tokens
    from lumen.formats import read_tokenizer

    show("import lumen")
    read_tokenizer("smollm2")  # (dropped: load_quantized reads the header again)
    show("the header and tokenizer alone")
    loaded = fast.load_quantized("smollm2")
    show("load_quantized")
    model, tok = loaded.model, loaded.tokenizer
    ids = torch.tensor([tok.encode("The capital of France is")])
    torch.set_num_threads(1)
    compile = {"eager": False, "compiled": True, "aot": "aot"}[mode]
    with torch.inference_mode(), fast.decoding(model, compile) as decoder:
        show("the decoding door")
        decoder.generate(ids, 2, temperature=0)
        show("the first steps")
        for _ in tokens(model, ids, n, GREEDY, step=decoder.step, cache_slots=256 if compile else None):
            pass
        show(f"{n} tokens decoded")


if __name__ == "__main__":
    main()
