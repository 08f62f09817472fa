"""One contender of bench_llamacpp.py, in its own process: lumen decoding SmolLM2's GGUF at each thread count.

    .venv/bin/python bench/lumen_decode.py gguf|float compiled|aot|eager THREADS,... TOKENS PROMPT_TOKENS [DEPTHS,...]

For each thread count (pinned) and each depth (default 0): greedy decoding of TOKENS new tokens after a prompt
of DEPTH tokens (a short one for depth 0; llama-bench's `-d`: the tokens already in the cache when the timed
ones start), through the speed wing's door (tokens/s after the first; compiling and the prompt not counted),
then the process's peak resident memory (VmHWM) so far, then a prompt of PROMPT_TOKENS tokens in one forward
pass as decoding runs it, to its first token (prefill tokens/s, eager: the door's products for many rows; as
llama-bench's pp, its keys and values cached and its last position's logits). Prints one JSON line. Not a test.
"""

from __future__ import annotations

import json
import sys
import time
import warnings

from rss import status_kib  # bench/rss.py (the script's own folder is on sys.path)

PROMPT = "The capital of France is"
FILLER = "The residual stream is a working memory: attention heads copy facts between positions. "
SLOTS = 256  # the door's cache sizes are multiples of this (lumen.fast.decoding.SLOTS)


def main() -> None:
    weights, mode, threads, n, n_prompt = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    depths = [int(d) for d in sys.argv[6].split(",")] if len(sys.argv) > 6 else [0]
    warnings.filterwarnings("ignore")
    import torch

    from lumen import decode, fast
    from lumen.decode import GREEDY
    from lumen.fast.decoding import frozen
    from lumen.formats import load

    loaded = fast.load_quantized("smollm2") if weights == "gguf" else load("smollm2")
    model, tok = loaded.model, loaded.tokenizer
    filler = tok.encode(FILLER * (max(n_prompt, *depths) // 10 + 1))
    long = torch.tensor([filler[:n_prompt]])
    prompts = {d: torch.tensor([filler[:d] if d else tok.encode(PROMPT)]) for d in depths}
    compile, out = {"eager": False, "compiled": True, "aot": "aot"}[mode], {}
    with torch.inference_mode(), fast.decoding(model, compile) as decoder:
        for t in map(int, threads.split(",")):
            torch.set_num_threads(t)
            out[t] = {"decode_by_depth": {}}
            for d, ids in prompts.items():
                slots = -(-(ids.size(1) + n) // SLOTS) * SLOTS if compile else None
                # compiles (or loads) the step for this cache size at this thread count (not counted)
                list(decode.tokens(model, ids, 4, GREEDY, step=decoder.step, cache_slots=slots))
                stamps, tokens = [], []
                # the thread count pinned: lumen.decode's steps through the door's step, untuned (the
                # collector's freeze as the door's tokens have it); the prompt is the first step, not timed
                steps = decode.tokens(model, ids, n + 1, GREEDY, step=decoder.step, cache_slots=slots)
                for x in frozen(steps):
                    stamps.append(time.perf_counter())
                    tokens.append(int(x[0]))
                out[t]["decode_by_depth"][str(d)] = n / (stamps[-1] - stamps[0])
                if d == depths[0]:
                    out[t]["decode_tok_s"], out[t]["text"] = out[t]["decode_by_depth"][str(d)], tok.decode(tokens)
        peak = status_kib("VmHWM") / 1024  # decoding's high-water mark, before any long prompt
        for t in out:
            torch.set_num_threads(t)
            model(long[:, :16])  # warm
            # the prompt as decoding runs it, to its first token (as llama-bench's pp: the keys and values
            # cached, the last position's logits)
            t0 = time.perf_counter()
            next(decode.tokens(model, long, 1, GREEDY))
            out[t]["prefill_tok_s"] = long.size(1) / (time.perf_counter() - t0)
    print(json.dumps({"max_rss_mib": peak, "threads": out}))


if __name__ == "__main__":
    main()
