"""The optimizers and the schedules of lumen.train.optim, against torch's own schedulers and what Muon and
AdamW are defined to do."""

from __future__ import annotations

import pytest
import torch

from lumen import GPT, ModelConfig
from lumen.errors import ConfigError
from lumen.train import TrainConfig, optim
from lumen.train.optim import MuonAdamW, StackedMuon, lr_at, make_optimizer, orthogonalize, set_lr


def small() -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig.from_name("baby-gpt").replace(vocab_size=50, n_layers=2, d_model=32, n_heads=2, context=16))


def test_wsd_matches_torch_schedulers_chained():
    """warm-up, stable, decay = torch's LinearLR (up), ConstantLR, LinearLR (down) one after another."""
    lr, min_lr, warmup, steps, decay = 1e-2, 1e-3, 10, 110, 0.3
    ours = [lr_at(s, lr, min_lr, warmup, steps, "wsd", decay) for s in range(steps)]
    cooldown = round(decay * (steps - warmup))
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    up = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1 / (warmup + 1), end_factor=1.0, total_iters=warmup)
    flat = torch.optim.lr_scheduler.ConstantLR(opt, factor=1.0, total_iters=0)
    down = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=min_lr / lr, total_iters=cooldown)
    # SequentialLR steps the decay's scheduler from the milestone on; its end is reached at the last step
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [up, flat, down],
                                                  milestones=[warmup, steps - 1 - cooldown])
    theirs = []
    for _ in range(steps):
        theirs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert ours[:warmup] == pytest.approx([lr * (s + 1) / (warmup + 1) for s in range(warmup)])
    assert ours[warmup:] == pytest.approx(theirs[warmup:], rel=1e-6)
    assert ours[-1] == pytest.approx(min_lr) and ours[warmup] == ours[steps - 1 - cooldown] == lr


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest():
    model = small()
    opt = make_optimizer(model, 1e-3, 0.1, (0.9, 0.95), "muon", muon_lr=0.02)
    assert isinstance(opt, MuonAdamW)
    by_id = {id(p): n for n, p in model.named_parameters()}
    muon = {by_id[id(p)] for g in opt.muon.param_groups for p in g["params"]}
    adamw = {by_id[id(p)] for g in opt.adamw.param_groups for p in g["params"]}
    assert muon == {n for n, p in model.named_parameters() if p.dim() == 2 and n.startswith("blocks.")}
    assert muon.isdisjoint(adamw) and muon | adamw == set(by_id.values())
    assert "tok_emb.weight" in adamw and "blocks.0.attn.out.weight" in muon
    set_lr(opt, 5e-4)  # the schedule moves both, Muon's at its own scale
    assert opt.adamw.param_groups[0]["lr"] == 5e-4 and opt.muon.param_groups[0]["lr"] == pytest.approx(0.01)


def test_muons_step_is_orthogonal_and_adamws_first_step_is_the_sign():
    """Muon moves a matrix by (nearly) an orthogonal matrix times its rate: the step's singular values close
    to 1 (five Newton-Schulz iterations land every direction holding over 1% of the gradient's norm in about
    [0.7, 1.2]: a tinier one grows 3.4x per iteration from where it starts), whatever the gradient's spread;
    AdamW's first step moves each entry by lr in the direction against its gradient."""
    model = small()
    opt = make_optimizer(model, 1e-3, 0.0, (0.9, 0.95), "muon", muon_lr=0.02)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    x = torch.randint(0, 50, (4, 16))
    _, loss = model(x, x)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    opt.step()
    after = dict(model.named_parameters())
    fc = "blocks.0.mlp.fc.weight"  # 128 x 32: Muon's original scale multiplies by sqrt(128 / 32)
    step = (before[fc] - after[fc].detach()) / (0.02 * 2.0)
    s = torch.linalg.svdvals(step)
    g = torch.linalg.svdvals(grads[fc])
    assert g.max() / g.min() > 5  # the gradient's directions differ in size ...
    big = g / g.norm() > 0.01
    assert big.sum() > 0.9 * len(g)
    assert 0.6 < s[big].min() and s[big].max() < 1.3  # ... the step's do not
    moved = before["tok_emb.weight"] - after["tok_emb.weight"].detach()
    has_grad = grads["tok_emb.weight"].abs() > 1e-12
    torch.testing.assert_close(moved[has_grad], 1e-3 * grads["tok_emb.weight"][has_grad].sign(), rtol=1e-3, atol=1e-8)


def test_muon_state_round_trips_and_refuses_adamws():
    model = small()
    opt = make_optimizer(model, 1e-3, 0.1, (0.9, 0.95), "muon")
    x = torch.randint(0, 50, (2, 16))
    model(x, x)[1].backward()
    opt.step()
    again = make_optimizer(model, 1e-3, 0.1, (0.9, 0.95), "muon")
    again.load_state_dict(opt.state_dict())
    for a, b in zip(again.muon.state.values(), opt.muon.state.values()):
        assert torch.equal(a["momentum_buffer"], b["momentum_buffer"])
    with pytest.raises(KeyError, match="another optimizer"):
        again.load_state_dict(make_optimizer(model, 1e-3, 0.1, (0.9, 0.95)).state_dict())


def test_bad_optimizer_settings_are_config_errors():
    with pytest.raises(ConfigError, match="optimizer must be adamw or muon, got 'sgd'"):
        TrainConfig(optimizer="sgd")
    with pytest.raises(ConfigError, match="schedule must be cosine or wsd"):
        TrainConfig(schedule="linear")
    with pytest.raises(ConfigError, match=r"decay must be in \(0, 1\]"):
        TrainConfig(decay=0.0)
    with pytest.raises(ConfigError, match="parallel = \"fsdp\" splits"):
        TrainConfig(optimizer="muon", parallel="fsdp")
    with pytest.raises(ConfigError, match="muon_ns_steps must be from 1 to 99"):
        TrainConfig(muon_ns_steps=0)


@pytest.mark.parametrize("bf16_products", [True, False], ids=["bf16-products", "float32-products"])
@pytest.mark.parametrize("ns_steps", [5, 3])
def test_stacked_muon_takes_torch_muons_steps(ns_steps, bf16_products, monkeypatch):
    """StackedMuon (one Newton-Schulz per stack of same-shape matrices) against torch.optim.Muon itself, one
    matrix at a time: the same weights after several steps of momentum, weight decay and a tall, a wide and a
    square matrix (to bfloat16's rounding of the update), and the same momentum buffers. Both ways of taking
    the bf16 products: as bf16 products, and as float32 products of the same bf16 numbers, rounded (what a CPU
    without oneDNN's bf16 kernels takes)."""
    if bf16_products and not optim.cpu.onednn_bf16():
        pytest.skip("bf16 products as bf16: this CPU has no oneDNN bf16 kernels (avx512bw/vl/dq or avx_ne_convert)")
    monkeypatch.setattr(optim.cpu, "onednn_bf16", lambda: bf16_products)
    shapes = [(24, 24), (24, 24), (96, 24), (24, 96), (96, 24)]
    gen = torch.Generator().manual_seed(0)
    start = [torch.randn(s, generator=gen) * 0.02 for s in shapes]
    ours, theirs = ([torch.nn.Parameter(w.clone()) for w in start] for _ in range(2))
    kw = {"lr": 0.02, "weight_decay": 0.05, "momentum": 0.95, "nesterov": True, "ns_steps": ns_steps,
          "adjust_lr_fn": "original"}
    stacked, reference = StackedMuon(ours, **kw), torch.optim.Muon(theirs, **kw)
    for _ in range(4):
        for a, b in zip(ours, theirs):
            a.grad = torch.randn(a.shape, generator=gen)
            b.grad = a.grad.clone()
        stacked.step()
        reference.step()
    for a, b, w in zip(ours, theirs, start):
        # each step moves a matrix by lr x (at most 2) x a bfloat16 matrix of entries below 1; the steps
        # themselves are far bigger than that
        torch.testing.assert_close(a, b, rtol=0, atol=4 * 0.02 * 2 * 2**-8)
        assert (a - w).abs().max() > 0.01
        torch.testing.assert_close(stacked.state[a]["momentum_buffer"], reference.state[b]["momentum_buffer"])


def test_newton_schulz_in_float32_products_is_the_bf16_one():
    """The float32 products of bf16 numbers, each rounded to bf16, against bf16 products (torch's, whatever
    kernel this CPU has): each product alone is the same to the order of its sums, and the five iterations
    amplify those last-bit differences to a few bf16 steps at most; both orthogonalize (singular values pushed
    into the polynomial's band around 1, from a spread of 10)."""
    gen = torch.Generator().manual_seed(0)
    u, v = (torch.linalg.qr(torch.randn(2, n, n, generator=gen))[0] for n in (96, 256))
    g = u @ torch.diag_embed(torch.logspace(0, 1, 96)).expand(2, 96, 96) @ v[:, :96]  # singular values 1 to 10
    coefficients = (3.4445, -4.7750, 2.0315)  # torch.optim.Muon's
    ours = orthogonalize(g, coefficients, 5, 1e-7, bf16_products=False)
    theirs = orthogonalize(g, coefficients, 5, 1e-7, bf16_products=True)
    assert ours.dtype == theirs.dtype == torch.bfloat16
    scale = theirs.float().abs().max()
    assert (ours.float() - theirs.float()).abs().max() <= 4 * 2**-8 * scale
    for x in (ours, theirs):
        s = torch.linalg.svdvals(x.double())
        assert s.min() > 0.5 and s.max() < 1.3
    assert torch.linalg.svdvals(g.double()).max() / torch.linalg.svdvals(g.double()).min() > 9.9
