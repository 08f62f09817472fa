"""Exercises of "Parameter accounting per block" and "Compute: FLOPs per token": formulas checked against
lumen.accounting on random shapes, and numbers checked against it with a stated relative tolerance."""

from __future__ import annotations

import random
from types import ModuleType

from ..accounting import count, formula, forward_flops_per_token, report, training_flops
from ..config import ModelConfig
from .exercise import Check, Context, Exercise, Hint, Mistake, Spec
from .probes import near, number


def _shapes(seed: int, n: int = 6, gqa: bool = True) -> list[ModelConfig]:
    """Random block shapes (GPT-2 style: heads of width d / h), with grouped-query attention when asked."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        heads = rng.choice([2, 4, 6, 8, 12, 16])
        d = heads * rng.choice([8, 16, 32, 64])
        kv = rng.choice([h for h in range(1, heads + 1) if heads % h == 0]) if gqa else heads
        gated = gqa and rng.random() < 0.5
        d_ff = rng.choice([None, 3 * d, 8 * d // 3 + 1, 5 * d])
        out.append(ModelConfig(vocab_size=rng.randint(50, 5000), context=rng.choice([64, 256, 1024]), d_model=d,
                               n_layers=rng.randint(1, 12), n_heads=heads, n_kv_heads=kv, d_ff=d_ff,
                               mlp="swiglu" if gated else "mlp", bias=not gated, tie_embeddings=rng.random() < 0.5))
    return out


def _integer(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise Mistake(f"{what} returned {value!r}, not a whole number")
    return int(value)


# -- counting parameters -----------------------------------------------------------------------------------

def _count_functions(m: ModuleType, ctx: Context) -> None:
    for cfg in _shapes(ctx.seed):
        f, d = formula(cfg), cfg.d_model
        att = _integer(m.attention_weights(d, cfg.n_heads, cfg.kv_heads), "attention_weights")
        if att != f.attention:
            hint = "gqa" if att == 4 * d * d and cfg.kv_heads != cfg.n_heads else "task"
            raise Mistake(f"attention_weights({d}, {cfg.n_heads}, {cfg.kv_heads}) = {att:,}; lumen's accounting: "
                          f"{f.attention:,}", hint)
        gated = cfg.mlp == "swiglu"
        mlp = _integer(m.mlp_weights(d, cfg.hidden, gated), "mlp_weights")
        if mlp != f.mlp:
            hint = "gated" if gated and mlp == 2 * d * cfg.hidden else "d_ff" if mlp == f.mlp * 4 * d // cfg.hidden \
                else "task"
            raise Mistake(f"mlp_weights({d}, {cfg.hidden}, gated={gated}) = {mlp:,}; lumen's accounting: {f.mlp:,}",
                          hint)


GPT2_REL = 0.02


def _count_gpt2(m: ModuleType, ctx: Context) -> None:
    got = number(m, "GPT2_SMALL_NON_EMBEDDING")
    c = count(ModelConfig.from_name("gpt2"))
    if near(got, c.non_embedding, GPT2_REL):
        return
    if near(got, c.total, GPT2_REL) or near(got, c.total - c.positions, GPT2_REL):
        raise Mistake(f"GPT2_SMALL_NON_EMBEDDING = {got:,.0f} is GPT-2 small's whole count, {c.total:,}", "embedding")
    raise Mistake(f"GPT2_SMALL_NON_EMBEDDING = {got:,.0f}; lumen counts {c.non_embedding:,} "
                  f"(within {GPT2_REL:.0%} passes)")


def _count_llama(m: ModuleType, ctx: Context) -> None:
    got = number(m, "LLAMA3_70B_ATTENTION_D2")
    cfg = ModelConfig.from_name("llama3-70b")
    want = formula(cfg).attention / cfg.d_model ** 2
    if near(got, want, GPT2_REL):
        return
    raise Mistake(f"LLAMA3_70B_ATTENTION_D2 = {got:g}; lumen's accounting: {want:.3f} d^2 "
                  f"(within {GPT2_REL:.0%} passes)", "gqa" if near(got, 4.0, GPT2_REL) else "task")


def _count_share(m: ModuleType, ctx: Context) -> None:
    got = number(m, "MLP_SHARE")
    f = formula(ModelConfig.from_name("gpt2"))
    want = f.mlp / f.block
    if near(got, want, 0.01):
        return
    raise Mistake(f"MLP_SHARE = {got:g}; lumen's accounting for GPT-2's block: {f.mlp:,} of {f.block:,} = "
                  f"{want:.4f} (within 1% passes)", "share" if near(got, f.mlp / f.attention, 0.01) else "task")


COUNT = Exercise(
    name="count-params",
    section="Parameter accounting per block",
    title="count a block in your head: 4d^2 + 8d^2, GQA's 2.25 d^2, GPT-2 small's 85M",
    task="""\
Count weights as the chapter does, biases and norms left out (d = d_model, heads of width d / n_heads):

1. attention_weights(d_model, n_heads, n_kv_heads): W_Q, W_K, W_V, W_O of one block; with grouped-query
   attention (n_kv_heads < n_heads) W_K and W_V are d x (n_kv_heads x d_head).
2. mlp_weights(d_model, d_ff, gated): 2 matrices of d x d_ff, or 3 for a gated MLP (SwiGLU).
3. The numbers (checked against lumen's accounting, the tolerance stated by the check):
   GPT2_SMALL_NON_EMBEDDING: GPT-2 small's non-embedding parameters (d = 768, 12 blocks, d_ff = 4d);
   LLAMA3_70B_ATTENTION_D2: Llama-3-70B's attention per block in units of d^2 (d = 8192, 64 heads, 8 KV heads);
   MLP_SHARE: the MLP's share of a GPT-2 block's weights.""",
    template='''\
def attention_weights(d_model, n_heads, n_kv_heads):
    raise NotImplementedError


def mlp_weights(d_model, d_ff, gated):
    raise NotImplementedError


GPT2_SMALL_NON_EMBEDDING = ...
LLAMA3_70B_ATTENTION_D2 = ...
MLP_SHARE = ...
''',
    specs=(Spec("attention_weights", "function", "def attention_weights(d_model, n_heads, n_kv_heads)", args=(8, 2, 1)),
           Spec("mlp_weights", "function", "def mlp_weights(d_model, d_ff, gated)", args=(8, 32, False)),
           Spec("GPT2_SMALL_NON_EMBEDDING", "value", "GPT2_SMALL_NON_EMBEDDING = a number"),
           Spec("LLAMA3_70B_ATTENTION_D2", "value", "LLAMA3_70B_ATTENTION_D2 = a number"),
           Spec("MLP_SHARE", "value", "MLP_SHARE = a number")),
    checks=(
        Check("attention_weights and mlp_weights equal lumen's accounting on random shapes, GQA and gated ones",
              _count_functions, gate=False),
        Check(f"GPT2_SMALL_NON_EMBEDDING within {GPT2_REL:.0%} of lumen's count", _count_gpt2, gate=False),
        Check(f"LLAMA3_70B_ATTENTION_D2 within {GPT2_REL:.0%} of lumen's accounting", _count_llama, gate=False),
        Check("MLP_SHARE within 1% of lumen's accounting", _count_share, gate=False),
    ),
    hints={
        "task": "W_Q and W_O are d x d; W_K and W_V are d x (n_kv_heads x d_head) with d_head = d / n_heads; the MLP "
                "has 2 (gated: 3) matrices of d x d_ff. GPT-2 small: 12 blocks of 12 d^2.",
        "gqa": Hint(
            "the sizes you give W_K and W_V under grouped-query attention.",
            "With grouped-query attention, W_K and W_V shrink to d x h_kv d_head each, so attention drops below "
            "4d^2; in Llama-3 70B it is about 2.25d^2.",
            "With grouped-query attention only W_Q and W_O stay d x d: W_K and W_V shrink to d x (n_kv_heads "
               "x d_head), so Llama-3-70B's attention is 2 d^2 + 2 d^2 x 8/64 = 2.25 d^2."),
        "gated": Hint(
            "how many matrices a gated MLP has.",
            "With SwiGLU the MLP has three matrices of size d x d_ff; with the usual d_ff = 8/3 d that is again "
            "about 8d^2, by design.",
            "A gated MLP (SwiGLU) has three matrices of d x d_ff, w_gate, w_up and w_down: 3 d d_ff."),
        "d_ff": Hint(
            "whether your MLP count uses the d_ff it is given, or assumes the default width.",
            "MLP: W1 is d x d_ff and W2 is d_ff x d. With d_ff = 4d that is 8d^2.",
            "Use the d_ff given: 2 d d_ff, which is 8 d^2 only when d_ff = 4d."),
        "embedding": Hint(
            "which parameters your count includes: the blocks only, or the token and position tables as well.",
            "Per block 12d^2 (attention 4d^2, MLP 8d^2), ignoring biases and norms; GPT-2 small has 85M non-"
            "embedding parameters.",
            "Non-embedding leaves out the token and position tables (and the tied unembedding): "
                     "12 blocks x 12 d^2 at d = 768 is about 85M, not GPT-2's whole 124M."),
        "share": Hint(
            "what you divide the MLP's parameters by.",
            "Attention 4d^2 + MLP 8d^2 = 12d^2 per block: two thirds of every block is the MLP.",
            "The share is of the whole block, attention included: 8 d^2 of 12 d^2."),
    },
    solution=("lumen.accounting.formula", "lumen.accounting.count_module"),
)


# -- FLOPs -------------------------------------------------------------------------------------------------

def _flops_function(m: ModuleType, ctx: Context) -> None:
    for cfg in _shapes(ctx.seed, gqa=False):
        L = cfg.context
        f = forward_flops_per_token(cfg, L)
        got = m.forward_flops(cfg, L)
        if isinstance(got, bool) or not isinstance(got, int | float):
            raise Mistake(f"forward_flops returned {got!r}, not a number")
        if near(got, f["total"], 1e-6):
            continue
        lookup, unembed = 2 * cfg.vocab_size * cfg.d_model, 2 * cfg.vocab_size * cfg.d_model
        positions = 2 * cfg.context * cfg.d_model
        seen = (f"forward_flops for d={cfg.d_model}, {cfg.n_layers} blocks, d_ff={cfg.hidden}, vocab "
                f"{cfg.vocab_size}, L={L}: {got:,.0f}; lumen: {f['total']:,.0f}")
        if near(got, f["total"] + lookup, 1e-6) or near(got, f["total"] + lookup + positions, 1e-6):
            raise Mistake(seen + " plus the embedding lookup", "embedding")
        if near(got, f["total"] - unembed, 1e-6):
            raise Mistake(seen + " without the unembedding", "unembedding")
        if near(got, f["weights"], 1e-6):
            raise Mistake(seen + " without the attention core", "core")
        if near(got, f["total"] / 2, 1e-6):
            raise Mistake(seen + ": half", "two")
        raise Mistake(seen)


TRAIN_REL = 0.10


def _train_number(name: str, preset: str, tokens: float, what: str):
    def check(m: ModuleType, ctx: Context) -> None:
        got = number(m, name)
        c = count(ModelConfig.from_name(preset))
        want = training_flops(c.non_embedding, tokens)
        if near(got, want, TRAIN_REL):
            return
        seen = (f"{name} = {got:.3g}; 6 N D with lumen's count of {what} gives {want:.3g} "
                f"(within {TRAIN_REL:.0%} passes)")
        if near(got, want / 3, TRAIN_REL):
            raise Mistake(seen, "six")
        if near(got, training_flops(c.total, tokens), TRAIN_REL) and not near(c.total, c.non_embedding, TRAIN_REL):
            raise Mistake(seen, "n")
        if any(near(got, want * f, TRAIN_REL) for f in (1e3, 1e-3, 1e6, 1e-6)):
            raise Mistake(seen, "units")
        raise Mistake(seen)
    return check


def _core_share(m: ModuleType, ctx: Context) -> None:
    got = number(m, "ATTENTION_CORE_SHARE")
    r = report(ModelConfig.from_name("gpt2"), 1024)
    want = r["attention_core_share"]
    if near(got, want, TRAIN_REL):
        return
    fl = r["flops_per_token"]
    seen = f"ATTENTION_CORE_SHARE = {got:g}; lumen's accounting: {want:.3f} (within {TRAIN_REL:.0%} passes)"
    if near(got, fl["attention_core"] / fl["total"], TRAIN_REL) or near(got, fl["attention_core"] / fl["weights"],
                                                                         TRAIN_REL):
        raise Mistake(seen, "share")
    raise Mistake(seen)


FLOPS = Exercise(
    name="flops",
    section="Compute: FLOPs per token ≈ 2 × parameters",
    title="FLOPs per token (2N + the attention core's 4Ld) and 6ND to train",
    task="""\
1. forward_flops(cfg, context): the forward FLOPs per token of a GPT-2-style lumen ModelConfig (fields d_model,
   n_layers, n_heads, d_ff or 4 d_model by default, vocab_size) at context L: 2 FLOPs per weight of every
   matrix multiplied (the blocks' W_Q, W_K, W_V, W_O, W_1, W_2 and the output projection; the embedding
   table is a lookup), plus the attention core (Q K^T and A V) at 4 L d per layer. Biases ignored.
2. The numbers (checked against lumen's accounting, the tolerance stated by the check):
   TRAIN_GPT2_SMALL_10B: FLOPs to train GPT-2 small (its 85M non-embedding parameters) on 10 billion tokens;
   TRAIN_70B_15T: FLOPs to train a 70B model (Llama-3-70B) on 15 trillion tokens;
   ATTENTION_CORE_SHARE: GPT-2 small's attention core at L = 1024 relative to 2N (N non-embedding).""",
    template='''\
def forward_flops(cfg, context):
    """Forward FLOPs per token of a GPT-2-style model at context length `context`."""
    raise NotImplementedError


TRAIN_GPT2_SMALL_10B = ...
TRAIN_70B_15T = ...
ATTENTION_CORE_SHARE = ...
''',
    specs=(Spec("forward_flops", "function", "def forward_flops(cfg, context)", args=(None, 8)),
           Spec("TRAIN_GPT2_SMALL_10B", "value", "TRAIN_GPT2_SMALL_10B = a number"),
           Spec("TRAIN_70B_15T", "value", "TRAIN_70B_15T = a number"),
           Spec("ATTENTION_CORE_SHARE", "value", "ATTENTION_CORE_SHARE = a number")),
    checks=(
        Check("forward_flops equals lumen's forward_flops_per_token on random GPT-2-style shapes", _flops_function,
              gate=False),
        Check(f"TRAIN_GPT2_SMALL_10B within {TRAIN_REL:.0%} of 6 N D (lumen's count of GPT-2 small)",
              _train_number("TRAIN_GPT2_SMALL_10B", "gpt2", 1e10, "GPT-2 small"), gate=False),
        Check(f"TRAIN_70B_15T within {TRAIN_REL:.0%} of 6 N D (lumen's count of Llama-3-70B)",
              _train_number("TRAIN_70B_15T", "llama3-70b", 15e12, "Llama-3-70B"), gate=False),
        Check(f"ATTENTION_CORE_SHARE within {TRAIN_REL:.0%} of lumen's accounting", _core_share, gate=False),
    ),
    hints={
        "task": "Count the weights multiplied per token: per block 4 d^2 (attention) + 2 d d_ff (MLP), plus the "
                "unembedding's vocab x d, 2 FLOPs each; add 4 L d per block for Q K^T and A V. Training: C = 6 N D, N "
                "non-embedding.",
        "embedding": Hint(
            "which matrices your per-token count includes at the two ends of the model.",
            "FLOPs per token = 2 N_params, where N_params counts the weight matrices actually multiplied: it "
            "excludes the input embedding table, which is a lookup, but includes the output projection.",
            "The embedding lookup costs no FLOPs: it reads one row of the table per token. Count the "
                     "unembedding (a real matmul) but not the lookup."),
        "unembedding": Hint(
            "whether your count has the output projection, d x vocab, in it (tied or not).",
            "N_params counts the weight matrices actually multiplied: it excludes the input embedding table but "
            "includes the output projection.",
            "The output projection is a matmul of d x vocab, even when it shares its weights with the "
                       "embedding: 2 vocab d FLOPs per token."),
        "core": Hint(
            "what your forward count leaves out that has no parameters at all.",
            "The attention core, QK^T and AV, adds about 4Ld per layer per token; this is not proportional to "
            "parameters (about 20% extra for GPT-2 small at L = 1024).",
            "Add the attention core: Q K^T and A V cost 2 L d each per layer (4 L d), not proportional to "
                "the parameters."),
        "two": Hint(
            "how many FLOPs you count for one weight used on one token.",
            "Every one of the d_in d_out weights is used exactly once per token, and each use is one multiply and"
            " one add.",
            "Each weight is used once per token as one multiply and one add: 2 FLOPs."),
        "six": Hint(
            "the factor between the forward pass and training in your answer.",
            "Training costs about three times the forward pass: backpropagation needs two more matrix "
            "multiplications of the same size for each one in the forward pass. C = 6ND.",
            "Training is about three forward passes (the backward pass does two matmuls per forward one): "
               "C = 6 N D, not 2 N D."),
        "n": Hint(
            "which parameter count you put for N: GPT-2 small's whole count, or another.",
            "For GPT-2 small (85M non-embedding parameters) on 10 billion tokens: 6 x 85M x 10^10, about 5 x "
            "10^18 FLOPs.",
            "N in 6 N D is the non-embedding count (85M for GPT-2 small), as the chapter and Kaplan et al. use."),
        "units": Hint(
            "the powers of ten in your numbers: billions, trillions, and what 70B means.",
            "6 x 85M x 10^10 = 5 x 10^18 (GPT-2 small, 10 billion tokens); 6 x 7 x 10^10 x 1.5 x 10^13 = 6 x "
            "10^24 (70B on 15 trillion tokens).",
            "Check the powers of ten: 10 billion tokens is 1e10, 15 trillion is 1.5e13, 70B parameters 7e10."),
        "share": Hint(
            "what you divide the attention core's FLOPs by.",
            "The attention core adds about 4Ld per layer per token on top of 2N (N non-embedding): for GPT-2 "
            "small at L = 1024 it is about 20% extra.",
            "The share is relative to 2N with N the non-embedding parameters (Kaplan's convention), not to "
                 "the whole forward pass."),
    },
    solution=("lumen.accounting.forward_flops_per_token", "lumen.accounting.training_flops"),
)
