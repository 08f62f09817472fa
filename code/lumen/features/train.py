"""Training a sparse autoencoder on a model's site, on a CPU: activations streamed from a corpus through
the model (run only as far as the site), a bounded shuffled buffer of them, Adam, and the training loop
every lumen run goes round (lumen.train.steps: records, checkpoints, Ctrl-C, exact resume after kill -9).

    >>> cfg = SAETrainConfig(site="blocks.15.resid_post", kind="topk", k=32, width=8, tokens=500_000)
    >>> sae = train_sae(model, tokenizer, cfg, out="out/sae")           # doctest: +SKIP

The recipe (Gao et al. 2024, "Scaling and evaluating sparse autoencoders", for TopK; Bricken et al. 2023 for
ReLU with an L1 penalty):

- the activations are scaled by one power of two, so that their mean squared norm per dimension is near 1
  (an exact scaling: it is folded into b_enc and b_dec when the dictionary is written, exactly undone on resume);
- b_dec starts at the geometric median of the first buffer of activations (the point the data is centred
  on), the decoder's rows are unit vectors (kept so after every step), and the encoder starts as the
  decoder's transpose;
- the loss is the batch's fraction of variance unexplained, plus for TopK the auxiliary loss AuxK: the
  latents that have not fired for `dead_after` tokens try to explain what the live ones missed, so that
  they come back to life (its weight 1/32);
- the first `skip_first` positions of every window are left out: SmolLM2's (and most Llama-like models')
  first position is an attention sink whose stream is ~100x larger than any other (a "massive
  activation"); it is kept as the model's own when the dictionary is spliced in (features.quality).

The data position: the buffer holds `buffer_tokens` activations of random windows of the corpus's training
split, drawn from a generator seeded by (seed, buffer number) and shuffled by it; every activation is used
`reuse` times, then the buffer is refilled. A step's batch is therefore a function of its step number, and a
resumed run recomputes its current buffer: memory stays at buffer_tokens x d_in floats, nothing of the
activations is written to disk, and the resumed run takes the same steps, bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import names
from ..data import TokenData, prepare
from ..errors import ConfigError, LumenError, UserError
from ..files import atomic_dir, write_text
from ..formats import checkpoint as ckpt
from ..inspect.cache import capture
from ..model import GPT
from ..progress import progress
from ..tokenizers import Tokenizer
from ..train.optim import lr_at, set_lr
from ..train.rundir import METRICS, RunDir
from ..train.steps import Loop
from .dictionary import SAE, BatchTopK, ReLU, TopK
from .quality import Quality, quality
from .saelens import CONFIG, WEIGHTS, read_saelens, save_saelens

KINDS = ("topk", "batchtopk", "relu")
SETTINGS = "sae_train.json"   # the run's settings, in its folder
FINAL = "sae"                 # the trained dictionary, in its folder (SAELens's format)
NEEDS = (CONFIG, WEIGHTS, ckpt.TRAINER)   # what a dictionary's checkpoint holds
SKIP_KEY = "lumen_skip_first"             # cfg.json's metadata: the first positions the dictionary never saw


def recorded_skip(spec: str | Path) -> int:
    """The first positions a dictionary was trained without, as its cfg.json records them (0 when it does not)."""
    from .saelens import locate

    try:
        value = json.loads((locate(spec) / CONFIG).read_text()).get("metadata", {}).get(SKIP_KEY, 0)
    except (OSError, ValueError, AttributeError):
        return 0
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


@dataclass(frozen=True)
class SAETrainConfig:
    """One dictionary's training run. The settings that define it (all but the session's: eval_interval,
    log_interval, keep_last, max_time) must be the same when it is resumed."""

    site: str                       # e.g. blocks.15.resid_post
    kind: str = "topk"              # topk | batchtopk | relu (with an L1 penalty)
    k: int = 32                     # active latents per token (topk, batchtopk)
    width: int = 8                  # d_sae = width x d_in
    tokens: int = 500_000           # the model's tokens read (each activation then used `reuse` times)
    batch: int = 4096               # activations per optimizer step
    lr: float = 0.0                 # Adam's; 0: Gao et al.'s 2e-4 / sqrt(d_sae / 2^14)
    warmup: int = 10                # steps of linear warm-up; the last `decay` of the steps go down to 0
    decay: float = 0.2
    l1: float = 5.0                 # relu: the weight of the L1 penalty on the features
    aux_k: int = 0                  # topk: how many dead latents the auxiliary loss uses (0: d_in / 2)
    aux_coef: float = 1 / 32        # topk: the auxiliary loss's weight
    dead_after: int = 100_000       # a latent that has not fired for this many tokens is dead
    buffer_tokens: int = 32_768     # activations held at once (the bound on memory: x d_in x 4 bytes)
    reuse: int = 1                  # times each activation is used
    corpus: str = "shakespeare"
    seq_len: int = 256              # tokens per window of text
    model_batch: int = 8            # windows per forward pass of the model
    skip_first: int = 1             # positions at the start of each window left out (the attention sink)
    eval_tokens: int = 8192         # held-out activations measured at each evaluation
    seed: int = 0
    eval_interval: int = 50
    log_interval: int = 5
    keep_last: int = 2
    max_time: float = 0.0

    SESSION = ("eval_interval", "log_interval", "keep_last", "max_time")

    def check(self, d_in: int, context: int) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"--kind {self.kind!r} is not one lumen trains; use one of {', '.join(KINDS)}")
        for key in ("k", "width", "tokens", "batch", "buffer_tokens", "reuse", "model_batch", "eval_tokens",
                    "dead_after", "eval_interval", "log_interval"):
            if getattr(self, key) < 1:
                raise ConfigError(f"--{key.replace('_', '-')} must be at least 1, got {getattr(self, key)}")
        if self.k > self.width * d_in:
            raise ConfigError(f"--k {self.k} is more than the dictionary's {self.width * d_in} latents")
        if self.buffer_tokens % self.batch:
            raise ConfigError(f"--buffer-tokens ({self.buffer_tokens}) must be a multiple of --batch ({self.batch}): "
                              f"every activation of a buffer is used before it is refilled")
        if not 2 <= self.seq_len <= context or not 0 <= self.skip_first < self.seq_len - 1:
            raise ConfigError(f"--seq-len {self.seq_len} must be from 2 to the model's context ({context}), "
                              f"with --skip-first ({self.skip_first}) below it")

    @property
    def steps(self) -> int:
        return max(1, math.ceil(self.tokens * self.reuse / self.batch))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def same_run(self, saved: dict, where: Path) -> None:
        changed = [f"{k} = {saved[k]!r} (now: {v!r})" for k, v in self.to_dict().items()
                   if k in saved and k not in self.SESSION and saved[k] != v]
        if changed:
            raise UserError(f"{where} was trained with other settings ({'; '.join(changed[:4])}): --resume "
                            f"continues a run with its own settings only; give those, or train into another --out")


def geometric_median(x: torch.Tensor, iterations: int = 20) -> torch.Tensor:
    """The point with the least summed distance to the rows of x (n, d): Weiszfeld's iteration, each step the
    mean of the rows weighted by 1 / their distance to the current guess (starting from the mean)."""
    m = x.mean(0)
    for _ in range(iterations):
        w = 1 / (x - m).norm(dim=-1).clamp_min(1e-8)
        m = (w[:, None] * x).sum(0) / w.sum()
    return m


def fvu(x: torch.Tensor, x_hat: torch.Tensor) -> torch.Tensor:
    """The fraction of x's variance (about its batch mean) that x_hat leaves unexplained."""
    return (x - x_hat).pow(2).sum() / (x - x.mean(0)).pow(2).sum()


class Activations:
    """The stream of a site's activations: token windows of the corpus through the model, up to the site."""

    def __init__(self, model: GPT, data: TokenData, site: str, cfg: SAETrainConfig):
        self.model, self.data, self.site, self.cfg = model, data, site, cfg

    def read(self, split: str, n_tokens: int, gen: torch.Generator, desc: str) -> torch.Tensor:
        """n_tokens activations (n_tokens, d) in float32 of random windows of a split, in window order."""
        cfg = self.cfg
        per_window = cfg.seq_len - cfg.skip_first
        starts = self.data.random_starts(split, cfg.seq_len, math.ceil(n_tokens / per_window), gen)
        out = []
        for part in progress(starts.split(cfg.model_batch), desc=desc, unit="forward"):
            x, _ = self.data.batch(split, part, cfg.seq_len)
            a = capture(self.model, x.to(self.model.device), self.site)   # the blocks above are never run
            out.append(a[:, cfg.skip_first:].flatten(0, 1).float().cpu())
        return torch.cat(out)[:n_tokens]

    def windows(self, split: str, n_tokens: int, gen: torch.Generator) -> torch.Tensor:
        """Token windows (n, seq_len) holding about n_tokens positions after the skipped ones."""
        cfg = self.cfg
        starts = self.data.random_starts(split, cfg.seq_len, math.ceil(n_tokens / (cfg.seq_len - cfg.skip_first)),
                                         gen)
        return self.data.batch(split, starts, cfg.seq_len)[0]


class SAETrainer(Loop):
    """A sparse autoencoder's run: its dictionary, Adam, the activation buffer, and the loop's machinery."""

    what = "lumen features train"

    def __init__(self, model: GPT, tokenizer: Tokenizer, cfg: SAETrainConfig, out: str | Path | None,
                 talks: bool = True, model_name: str = ""):
        from .splice import check_fits

        if names.parse(cfg.site).layer is None:
            raise UserError(f"--site {cfg.site!r} is not a site inside a block (e.g. blocks.15.resid_post)")

        self.model, self.tokenizer, self.cfg, self.model_name = model.eval(), tokenizer, cfg, model_name
        d_in = model.cfg.hidden if names.parse(cfg.site).kind in ("mlp_hidden", "mlp_pre") else model.cfg.d_model
        cfg.check(d_in, model.cfg.context)
        super().__init__(RunDir(out, NEEDS) if out is not None else None, talks)
        self.steps, self.eval_interval, self.log_interval = cfg.steps, cfg.eval_interval, cfg.log_interval
        self.max_time, self.keep_last = cfg.max_time, cfg.keep_last
        torch.manual_seed(cfg.seed)
        act = {"topk": TopK(cfg.k), "batchtopk": BatchTopK(cfg.k), "relu": ReLU()}[cfg.kind]
        self.sae = SAE(d_in, cfg.width * d_in, act, site=cfg.site)
        try:
            check_fits(model, self.sae)
        except LumenError as e:
            raise UserError(f"--site {cfg.site}: {e}") from None
        self.opt = torch.optim.Adam(self.sae.parameters(), lr=self.lr, betas=(0.9, 0.999), eps=6.25e-10)
        self.scale = 1.0                                    # the activations are divided by this power of two
        self.since_fired = torch.zeros(self.sae.d_sae, dtype=torch.long)   # tokens since each latent last fired
        self.data = token_data(cfg.corpus, tokenizer)
        self.data.check_context(cfg.seq_len)
        self.stream = Activations(model, self.data, cfg.site, cfg)
        self.buffer_number, self.buffer, self.order = -1, torch.zeros(0), torch.zeros(0, dtype=torch.long)
        self.heldout: torch.Tensor | None = None
        # where the time goes: reading the activations (model), training on them (sae), each as wall-clock and as
        # this process's CPU seconds (on a busy machine the CPU seconds say what a quiet one would take)
        self.seconds = {"model": 0.0, "sae": 0.0, "model_cpu": 0.0, "sae_cpu": 0.0}

    @contextmanager
    def clock(self, phase: str) -> Iterator[None]:
        """Count the wall-clock and CPU seconds of the block to `phase`."""
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - wall
            self.seconds[f"{phase}_cpu"] = self.seconds.get(f"{phase}_cpu", 0.0) + time.process_time() - cpu

    @property
    def lr(self) -> float:
        return self.cfg.lr or 2e-4 / math.sqrt(self.cfg.width * self.model.cfg.d_model / 2**14)

    @property
    def read_tokens(self) -> int:
        """The model's tokens read into the buffers the steps so far used (the positions skipped included)."""
        buffers = math.ceil(self.step / self.steps_per_buffer)
        return buffers * math.ceil(self.cfg.buffer_tokens / (self.cfg.seq_len - self.cfg.skip_first)) * self.cfg.seq_len

    @property
    def steps_per_buffer(self) -> int:
        return self.cfg.buffer_tokens * self.cfg.reuse // self.cfg.batch

    # the data position --------------------------------------------------------------------------------
    def fill(self, number: int) -> None:
        """Buffer `number`: its activations and the order they are used in, both from its own generator."""
        cfg = self.cfg
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + number)
        with self.clock("model"):
            acts = self.stream.read("train", cfg.buffer_tokens, gen, f"reading buffer {number} of {cfg.site}")
        self.buffer = acts / self.scale
        self.order = torch.cat([torch.randperm(cfg.buffer_tokens, generator=gen) for _ in range(cfg.reuse)])
        self.buffer_number = number

    def batch_at(self, step: int) -> torch.Tensor:
        """The activations step `step` trains on (0-based)."""
        number, place = divmod(step, self.steps_per_buffer)
        if number != self.buffer_number:
            self.fill(number)
        return self.buffer[self.order[place * self.cfg.batch:(place + 1) * self.cfg.batch]]

    def start_fresh(self) -> None:
        """Step 0: the scale and b_dec from the first buffer (read at the scale 1, then rescaled)."""
        self.fill(0)
        rms = self.buffer.pow(2).sum(-1).mean().div(self.sae.d_in).sqrt().item()
        self.scale = 2.0 ** round(math.log2(rms))       # a power of two: dividing by it is exact
        self.buffer = self.buffer / self.scale
        with torch.no_grad():
            self.sae.b_dec.copy_(geometric_median(self.buffer))

    # one step -----------------------------------------------------------------------------------------
    def losses(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """The loss of a batch of activations x (n, d_in) and its parts."""
        sae, cfg = self.sae, self.cfg
        pre = sae.pre(x)
        if cfg.kind == "topk":
            # the same as decode(act(pre)), reading only the k active rows of W_dec for each token (k x d_in
            # products instead of d_sae x d_in)
            top = pre.topk(cfg.k, dim=-1)
            active = top.values.relu()
            x_hat = torch.einsum("nk,nkd->nd", active, sae.W_dec[top.indices]) + sae.b_dec
            f = torch.zeros_like(pre).scatter(-1, top.indices, active.detach())
        else:
            f = sae.act(pre)
            x_hat = sae.decode(f)
        # mse: the fraction of the batch's variance the reconstruction leaves unexplained
        parts = {"mse": fvu(x, x_hat)}
        if cfg.kind == "relu":
            # l1: every feature's activation times its decoder row's length (1 here), summed per token
            parts["l1"] = cfg.l1 * f.sum(-1).mean() / x.pow(2).sum(-1).mean().sqrt()
        else:
            dead = self.since_fired >= cfg.dead_after
            if dead.any():
                # aux: the dead latents' best attempt at the error e = x - x_hat, from their own top pre-activations
                # (the live latents' left out), as a fraction of the error's variance; its gradient reaches
                # only the dead latents' encoder and decoder rows
                e = (x - x_hat).detach()
                which = dead.nonzero().squeeze(1)
                k_aux = min(cfg.aux_k or sae.d_in // 2, len(which))
                dead_pre = pre[:, which]
                top = dead_pre.topk(k_aux, dim=-1)
                f_aux = torch.zeros_like(dead_pre).scatter(-1, top.indices, top.values.relu())
                e_hat = f_aux @ sae.W_dec[which]
                parts["aux"] = cfg.aux_coef * fvu(e, e_hat).nan_to_num(0.0)
        with torch.no_grad():
            fired = (f > 0).any(0)
            self.since_fired += x.size(0)
            self.since_fired[fired] = 0
            self.l0 = float((f > 0).sum(-1).float().mean())
        return parts

    def train_step(self) -> dict:
        x = self.batch_at(self.step)
        with self.clock("sae"):
            return self.optimizer_step(x)

    def optimizer_step(self, x: torch.Tensor) -> dict:
        """One step of Adam on the batch x."""
        cfg = self.cfg
        lr = lr_at(self.step, self.lr, 0.0, cfg.warmup, self.steps, "wsd", cfg.decay)
        set_lr(self.opt, lr)
        parts = self.losses(x)
        loss = sum(parts.values())
        assert isinstance(loss, torch.Tensor)
        if not math.isfinite(loss.item()):
            from ..errors import TrainingError

            raise TrainingError(self.bad_value_message(loss.item()) + "; lower --lr")
        loss.backward()
        W = self.sae.W_dec
        with torch.no_grad():
            assert W.grad is not None
            # each decoder row stays a unit vector: its gradient along the row itself is removed before the
            # step, and the row set back to length 1 after it
            W.grad -= (W.grad * W).sum(-1, keepdim=True) * W
            self.opt.step()
            W.div_(W.norm(dim=-1, keepdim=True))
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens += cfg.batch
        return {"loss": loss.item(), **{k: v.item() for k, v in parts.items()}, "l0": self.l0, "lr": lr,
                "dead": float((self.since_fired >= cfg.dead_after).float().mean()),
                "model_s": round(self.seconds["model"], 2), "sae_s": round(self.seconds["sae"], 2)}

    def log_line(self, rec: dict) -> dict[str, str]:
        return {"fvu": f"{rec['mse']:.3f}", "l0": f"{rec['l0']:.1f}", "dead": f"{rec['dead']:.1%}"}

    # evaluation -----------------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> dict:
        """FVU, L0 and the latents that never fire, on held-out activations (the validation split's)."""
        if self.heldout is None:
            gen = torch.Generator().manual_seed(self.cfg.seed + 7)
            with self.clock("model"):
                self.heldout = self.stream.read("val", self.cfg.eval_tokens, gen, "reading held-out activations")
        x = self.heldout / self.scale
        f = torch.cat([self.sae.encode(part) for part in x.split(self.cfg.batch)])
        x_hat = self.sae.decode(f)
        return {"val_loss": float(fvu(x, x_hat)), "val_l0": float((f > 0).sum(-1).float().mean()),
                "val_dead": 1 - float((f > 0).any(0).float().mean())}

    def eval_line(self, rec: dict, seconds: float) -> str:
        return (f"step {self.step}/{self.steps}: held-out FVU {rec['val_loss']:.3f}, L0 {rec['val_l0']:.1f}, "
                f"never fired {rec['val_dead']:.1%} ({self.cfg.eval_tokens:,} tokens), {seconds:.0f} s")

    # checkpoints --------------------------------------------------------------------------------------
    def dictionary(self) -> SAE:
        """The dictionary as it reads the model's own activations: the scale folded into b_enc and b_dec
        (TopK, BatchTopK and ReLU scale with their input, so f(x) = scale x f(x / scale)): the same features,
        `scale` times larger, and the decoder's rows still unit vectors."""
        out = SAE(self.sae.d_in, self.sae.d_sae, type(self.sae.act)(self.cfg.k) if self.cfg.kind != "relu"
                  else ReLU(), site=self.cfg.site)
        out.load_state_dict(self.sae.state_dict())
        with torch.no_grad():
            out.b_enc.mul_(self.scale)
            out.b_dec.mul_(self.scale)
        return out

    def save_dictionary(self, path: Path) -> None:
        """The dictionary in SAELens's format, its cfg.json's metadata naming the positions it was trained
        without (`lumen features --sae` leaves them out by default) and the model it read."""
        save_saelens(self.dictionary(), path)
        cfg = json.loads((path / CONFIG).read_text())
        cfg["metadata"].update({SKIP_KEY: self.cfg.skip_first, "model_name": self.model_name,
                                "dataset_path": self.cfg.corpus, "context_size": self.cfg.seq_len})
        write_text(path / CONFIG, json.dumps(cfg, indent=1) + "\n")

    def trainer_state(self) -> dict:
        return {"optimizer": self.opt.state_dict(), "step": self.step, "tokens": self.tokens, "best": self.best,
                "data_generator": torch.tensor([self.cfg.seed, self.step]),   # the data position is the step
                "torch_rng": [torch.get_rng_state()], "world": 1, "train_config": json.dumps(self.cfg.to_dict()),
                "scale": self.scale, "since_fired": self.since_fired.clone(), "seconds": dict(self.seconds)}

    def write_checkpoint(self, path: Path, meta: dict, state: dict) -> None:
        with atomic_dir(path) as tmp:
            self.save_dictionary(tmp / FINAL)
            for f in (tmp / FINAL).iterdir():
                f.replace(tmp / f.name)
            (tmp / FINAL).rmdir()
            torch.save(state, tmp / ckpt.TRAINER)
            (tmp / ckpt.META).write_text(json.dumps({**meta, "model": self.model_name}, indent=1) + "\n")
            ckpt.write_manifest(tmp)

    def restore(self, path: Path) -> dict:
        state = ckpt.load_trainer_state(path)
        self.cfg.same_run(json.loads(state["train_config"]), path.parent.parent)
        saved = read_saelens(path)
        self.scale = float(state["scale"])
        with torch.no_grad():
            self.sae.load_state_dict(saved.state_dict())
            self.sae.b_enc.div_(self.scale)                 # exact: the scale is a power of two
            self.sae.b_dec.div_(self.scale)
        self.opt.load_state_dict(state["optimizer"])
        self.since_fired = state["since_fired"]
        self.seconds = dict(state["seconds"])
        torch.set_rng_state(state["torch_rng"][0])
        return state

    def open_run_dir(self, resume: bool) -> None:
        assert self.run_dir is not None
        self.run_dir.check(resume)
        if self.resume(resume) is None:      # a fresh run (or --resume before the first checkpoint)
            settings = self.run_dir.path / SETTINGS
            if resume and settings.exists():
                self.cfg.same_run(json.loads(settings.read_text()), self.run_dir.path)
            self.run_dir.path.mkdir(parents=True, exist_ok=True)
            write_text(settings, json.dumps(self.cfg.to_dict(), indent=1) + "\n")
            write_text(self.run_dir.path / METRICS, "")
            self.history = []

    # the run ------------------------------------------------------------------------------------------
    def run(self, resume: bool = False) -> SAE:
        """Train to the last step (or on from the newest checkpoint with resume); returns the dictionary as
        it reads the model's activations (also written to OUT/sae when there is a run directory)."""
        if self.run_dir is not None:
            self.open_run_dir(resume)
        if self.step == 0:
            self.start_fresh()
        if self.talks:
            print(f"{self.what}: {self.sae.d_sae:,} {self.cfg.kind} latents (k = {self.cfg.k}) on {self.cfg.site}, "
                  f"{self.steps:,} steps of {self.cfg.batch:,} activations, buffer {self.cfg.buffer_tokens:,} "
                  f"activations ({self.cfg.buffer_tokens * self.sae.d_in * 4 / 2**20:.0f} MiB), lr {self.lr:.2g}",
                  file=sys.stderr)
        bar = progress(total=self.steps, desc="training the dictionary", unit="step")
        bar.update(self.step)
        try:
            self.run_steps(bar)
        finally:
            bar.close()
        final = self.dictionary()
        if self.run_dir is not None:
            self.save_dictionary(self.run_dir.path / FINAL)
        return final

    def report(self, windows: torch.Tensor) -> Quality:
        """The trained dictionary on held-out windows, with the cross-entropy it recovers spliced in."""
        with self.clock("report"):
            q = quality(self.model, self.dictionary(), windows, skip=self.cfg.skip_first)
        return q


def token_data(corpus: str, tokenizer: Tokenizer) -> TokenData:
    """The corpus tokenized by the model's own tokenizer, memory-mapped (lumen.data's cache: tokenized once)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = tokenizer.save(tmp)
        try:
            return prepare(corpus, tokenizer=str(path))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
