"""Checks of unit 10 (pretraining).

Oracles: ``F.cross_entropy`` on flattened logits, ``torch.nn.utils.clip_grad_norm_`` (blocked while the
learner's clipping runs), the closed-form schedule, AdamW's decoupled decay read off the weights after a
step with zero gradients, and gradients computed here with autograd to predict SGD updates. Fixtures:
the syllabus's worked examples (``arange(100)`` batches, the schedule at six steps, gradients ``[3, 4]``
and ``[0, 12]``, the parameter groups of ``gpt2-char-tiny``). Training is checked by properties computed
from returned weights and losses: the update length under clipping, no gradient accumulation, exact
resumption from a checkpoint with dropout active, the loss falling on a repeated batch, and the mode
after evaluation. Dropout masks are never compared with the reference.

Contract clauses and the probes that cover them (what is not listed is not graded):

``10.get_batch``: the prescribed randint call (offsets and what the generator draws next); y = x shifted by one;
  (B, T) long for any integer dtype
``10.lm_loss``: = F.cross_entropy over flattened positions; default and custom ``ignore_index``; 0-d, backward-able;
  ``perplexity`` = exp(mean)
``10.warmup_cosine_lr``: values at named steps for two settings (a grid past the end) and ``warmup_steps=0``;
  continuous at warm-up; never increasing after it; a Python float
``10.clip_grad_norm``: the worked example; the returned norm before clipping; parameters without grad skipped; a
  generator argument; ``eps`` at a non-default value; torch's own clipping blocked and compared
``10.configure_optimizer``: AdamW; two groups; each tensor once (tied head); group membership by what a tensor does;
  ``weight_decay`` and ``betas`` passed on (non-default values); one step with zero gradients shrinks only group 0
``10.train_steps`` (with ``save_checkpoint``, ``load_checkpoint``, ``estimate_loss``): clipping before the update
  (SGD step length); zero_grad every step; AdamW with two groups and a changing lr; the loss falls on a repeated
  batch; exact resumption with dropout on (checkpoint keys, weights_only load, optimizer and RNG state); a model
  handed over in eval mode trains with dropout on; estimate_loss in eval mode, without autograd, deterministic,
  the caller's mode restored, weights and buffers unchanged
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..core import check, forbid
from ..runner import also_blocked
from ..strength import decision, defining_property

U = "10"
T = torch.tensor


def _ref():
    from llmcourse.data import corpus as C
    from llmcourse.train import checkpoints as K
    from llmcourse.train import losses as L
    from llmcourse.train import optim as O
    from llmcourse.train import pretraining as P
    from llmcourse.train import schedules as S

    return {
        "get_batch": C.get_batch, "lm_loss": L.lm_loss, "perplexity": L.perplexity,
        "warmup_cosine_lr": S.warmup_cosine_lr, "clip_grad_norm": O.clip_grad_norm,
        "configure_optimizer": O.configure_optimizer, "save_checkpoint": K.save_checkpoint,
        "load_checkpoint": K.load_checkpoint, "train_steps": P.train_steps, "estimate_loss": P.estimate_loss,
    }


def _windows(data, offsets, t):
    """Independent batch construction: rows data[o : o+t] and data[o+1 : o+t+1]."""
    x = torch.stack([data[o:o + t] for o in offsets]).long()
    y = torch.stack([data[o + 1:o + t + 1] for o in offsets]).long()
    return x, y


# ================================================================== 10.get_batch


def _batch_probe(data, b, t, seed):
    def probe(impl):
        g = torch.Generator().manual_seed(seed)
        x, y = impl.get_batch(data, b, t, g)
        after = torch.randint(0, 2**31 - 1, (4,), generator=g)  # what the generator draws next
        return x, y, after
    return probe


@check(f"{U}.get_batch", ["get_batch"], _ref)
def check_get_batch(t):
    data = torch.arange(100)
    out = t.run(lambda impl: impl.get_batch(torch.arange(100), 2, 4, torch.Generator().manual_seed(0)))
    t.expect(isinstance(out, (tuple, list)) and len(out) == 2, "get_batch must return a pair (x, y)")
    x, y = out
    t.expect(isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor), "x and y must be tensors")
    t.expect(tuple(x.shape) == (2, 4) and tuple(y.shape) == (2, 4),
             f"with B=2, T=4 both x and y must have shape (2, 4); got {tuple(x.shape)} and {tuple(y.shape)}")
    t.expect(x.dtype == torch.long and y.dtype == torch.long, f"x and y must be long tensors; got {x.dtype}, {y.dtype}")
    if torch.equal(x, y):
        t.fail("y equals x: the targets must be the next tokens, y[b] = data[o+1 : o+T+1]",
               bug="B10.target_not_shifted")
    t.expect(torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1),
             f"each row of y must be its row of x shifted by one token; got x = {x.tolist()}, y = {y.tolist()}",
             bug="B10.target_not_shifted")
    # the worked example: data = arange(100), B=2, T=4, seed 0
    probe = _batch_probe(data, 2, 4, 0)
    res = t.run(probe)
    ox, _, after = res
    want_offsets = [44, 15]
    g = torch.Generator().manual_seed(0)
    torch.randint(0, 96, (2,), generator=g)
    want_after = torch.randint(0, 2**31 - 1, (4,), generator=g)
    if ox[:, 0].tolist() != want_offsets:
        valid = bool(((ox[:, 0] >= 0) & (ox[:, 0] <= 95)).all())
        bug = t.diagnose(probe, res) or ("B10.randint_call" if valid else None)
        t.fail(f"data = arange(100), B=2, T=4, torch.Generator().manual_seed(0): expected offsets {want_offsets} "
               f"(x = [[44, 45, 46, 47], [15, 16, 17, 18]]), got offsets {ox[:, 0].tolist()}", bug=bug)
    t.expect(torch.equal(after, want_after),
             "the generator must be used for exactly one draw, torch.randint(0, len(data) − T, (B,), generator=g): "
             "after your call it is in a different state", bug="B10.randint_call")

    # random streams, several sizes, against windows cut here from the same offsets
    stream = torch.randint(0, 50, (300,), generator=torch.Generator().manual_seed(7))
    for b, tt, seed in ((5, 7, 3), (16, 32, 11), (1, 1, 5)):
        g = torch.Generator().manual_seed(seed)
        offsets = torch.randint(0, len(stream) - tt, (b,), generator=g).tolist()
        ex, ey = _windows(stream, offsets, tt)
        t.compare(_batch_probe(stream, b, tt, seed), ex, f"x for a random stream of 300 ids, B={b}, T={tt}, seed {seed}",
                  pick=lambda o: o[0])
        t.compare(_batch_probe(stream, b, tt, seed), ey, f"y for a random stream of 300 ids, B={b}, T={tt}, seed {seed}",
                  pick=lambda o: o[1])
    # the last possible window: len(data) = T + 1 leaves exactly one offset, 0
    short = torch.arange(10, 19, dtype=torch.int32)
    sx, sy, _ = t.run(_batch_probe(short, 6, 8, 0))
    t.expect(torch.equal(sx, torch.arange(10, 18).expand(6, 8)) and torch.equal(sy, torch.arange(11, 19).expand(6, 8)),
             "with len(data) = T + 1 the only valid offset is 0 (offsets must stay in range 0 … len(data) − T − 1)",
             bug="B10.randint_call")
    t.expect(sx.dtype == torch.long, f"x must be long even when data is int32; got {sx.dtype}")


# ================================================================== 10.lm_loss


@check(f"{U}.lm_loss", ["lm_loss", "perplexity"], _ref)
def check_lm_loss(t):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g)
    targets = torch.randint(0, 11, (3, 5), generator=g)
    out = t.run(lambda impl: impl.lm_loss(logits, targets))
    t.expect(isinstance(out, torch.Tensor) and out.dim() == 0 and out.is_floating_point(),
             f"lm_loss must return a 0-d float tensor (the mean loss); got "
             f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}")
    t.compare(lambda impl: impl.lm_loss(logits, targets),
              F.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1)),
              "mean cross-entropy of logits (3, 5, 11) against targets (3, 5)", atol=1e-6)
    # T == V: the unflattened call runs silently and gives a different number
    sq = torch.randn(2, 6, 6, generator=g)
    sq_t = torch.randint(0, 6, (2, 6), generator=g)
    t.compare(lambda impl: impl.lm_loss(sq, sq_t), F.cross_entropy(sq.reshape(-1, 6), sq_t.reshape(-1)),
              "mean cross-entropy for logits (2, 6, 6) (sequence length = vocabulary size)", atol=1e-6)
    # gradients flow, and equal those of the flattened cross-entropy

    def grad_probe(impl):
        z = logits.clone().requires_grad_(True)
        impl.lm_loss(z, targets).backward()
        return z.grad

    z = logits.clone().requires_grad_(True)
    F.cross_entropy(z.reshape(-1, 11), targets.reshape(-1)).backward()
    t.compare(grad_probe, z.grad, "the gradient of lm_loss with respect to the logits (the loss must stay a tensor "
              "in the graph, not a Python float)", atol=1e-6)
    # ignore_index
    masked = targets.clone()
    masked[0, :3] = -100
    masked[2, 4] = -100
    t.compare(lambda impl: impl.lm_loss(logits, masked),
              F.cross_entropy(logits.reshape(-1, 11), masked.reshape(-1), ignore_index=-100),
              "positions whose target is -100 (the default ignore_index) must not count", atol=1e-6)
    t.compare(lambda impl: impl.lm_loss(logits, targets, ignore_index=int(targets[0, 0])),
              F.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1), ignore_index=int(targets[0, 0])),
              "a custom ignore_index must be passed on", atol=1e-6)
    # a uniform model: ln V
    uniform = torch.zeros(2, 4, 65)
    ids = torch.randint(0, 65, (2, 4), generator=g)
    t.compare(lambda impl: impl.lm_loss(uniform, ids), torch.tensor(math.log(65)),
              "all-zero logits over V = 65 (a uniform model) must give ln 65", atol=1e-6)
    # perplexity
    p = t.run(lambda impl: impl.perplexity(math.log(65)))
    t.expect(isinstance(p, float), f"perplexity must return a Python float; got {type(p).__name__}")
    t.compare(lambda impl: impl.perplexity(math.log(65)), 65.0, "perplexity(ln 65)", atol=1e-9, rtol=1e-9)
    t.compare(lambda impl: [impl.perplexity(v) for v in (0.0, 1.5, 4.174)], [1.0, math.exp(1.5), math.exp(4.174)],
              "perplexity(mean_loss) = exp(mean_loss)", atol=1e-9, rtol=1e-9)


# ================================================================== 10.warmup_cosine_lr


def _cosine(step, max_lr, min_lr, w, n):
    if step < w:
        return max_lr * (step + 1) / w
    if step > n:
        return min_lr
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * (step - w) / (n - w)))


@check(f"{U}.warmup_cosine_lr", ["warmup_cosine_lr"], _ref)
def check_warmup_cosine_lr(t):
    steps = [0, 9, 10, 55, 100, 150]
    v = t.run(lambda impl: impl.warmup_cosine_lr(0, 1e-3, 1e-4, 10, 100))
    t.expect(isinstance(v, (float, int)) and not isinstance(v, bool),
             f"warmup_cosine_lr must return a Python float; got {type(v).__name__}")
    t.compare(lambda impl: [float(impl.warmup_cosine_lr(s, 1e-3, 1e-4, 10, 100)) for s in steps],
              [1e-4, 1e-3, 1e-3, 5.5e-4, 1e-4, 1e-4],
              f"max_lr=1e-3, min_lr=1e-4, warmup_steps=10, total_steps=100 at steps {steps}", atol=1e-12, rtol=1e-9)
    # another configuration, every 7th step up to past the end
    grid = list(range(0, 330, 7)) + [19, 20, 21, 300, 301]
    got = t.compare(lambda impl: [float(impl.warmup_cosine_lr(s, 6e-4, 6e-5, 20, 300)) for s in grid],
                    [_cosine(s, 6e-4, 6e-5, 20, 300) for s in grid],
                    "max_lr=6e-4, min_lr=6e-5, warmup_steps=20, total_steps=300 at steps 0, 7, 14, …, 329",
                    atol=1e-12, rtol=1e-9)
    # properties (implied by the values above; stated for the message)
    lr = dict(zip(grid, got))
    t.expect(abs(lr[19] - 6e-4) < 1e-12 and abs(lr[20] - 6e-4) < 1e-12, "the schedule must be continuous at warmup")
    after = [lr[s] for s in sorted(s for s in lr if s >= 20)]
    t.expect(all(a >= b - 1e-15 for a, b in zip(after, after[1:])), "after warm-up the lr must never increase")
    # no warm-up at all
    t.compare(lambda impl: [float(impl.warmup_cosine_lr(s, 1.0, 0.0, 0, 4)) for s in range(6)],
              [_cosine(s, 1.0, 0.0, 0, 4) for s in range(6)],
              "warmup_steps=0 (cosine from the first step): max_lr=1, min_lr=0, total_steps=4 at steps 0 … 5",
              atol=1e-12)


# ================================================================== 10.clip_grad_norm


def _clip_forbidden():
    import torch.nn.utils as U_
    import torch.nn.utils.clip_grad as CG

    targets = [(U_, name) for name in ("clip_grad_norm_", "clip_grad_norm", "clip_grads_with_norm_", "get_total_norm")
               if hasattr(U_, name)]
    targets += [(CG, name) for name in ("clip_grad_norm_", "clip_grad_norm", "clip_grads_with_norm_", "get_total_norm")
                if hasattr(CG, name)]
    return forbid(*targets, reason="write the global-norm clipping yourself")


def _tiny_grads(seed):
    """Parameters of a small MLP with gradients from one backward pass (deterministic)."""
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Linear(16, 4), torch.nn.LayerNorm(4))
    x = torch.randn(8, 6)
    (net(x) ** 2).sum().backward()
    return net


def _clip_probe(seed, max_norm, frozen=False):
    def probe(impl):
        net = _tiny_grads(seed)
        if frozen:
            net[0].bias.grad = None  # a parameter without a gradient is skipped
        with _clip_forbidden():
            norm = impl.clip_grad_norm(net.parameters(), max_norm)  # a generator: one pass only
        return norm, [p.grad for p in net.parameters() if p.grad is not None]
    return probe


@check(f"{U}.clip_grad_norm", ["clip_grad_norm"], _ref)
def check_clip_grad_norm(t):
    def f104(impl):
        a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
        c = torch.nn.Parameter(torch.zeros(3))  # no gradient
        a.grad, b.grad = torch.tensor([3.0, 4.0]), torch.tensor([0.0, 12.0])
        with _clip_forbidden():
            norm = impl.clip_grad_norm([a, b, c], 1.0)
        return norm, a.grad, b.grad

    norm, ga, gb = t.run(f104)
    t.expect(isinstance(norm, (float, int)) or (isinstance(norm, torch.Tensor) and norm.numel() == 1),
             f"clip_grad_norm must return the norm as a float; got {type(norm).__name__}")
    t.compare(f104, 13.0, "the returned norm for gradients [3, 4] and [0, 12] (the global norm before clipping)",
              atol=1e-5, pick=lambda o: float(o[0]))
    t.compare(f104, T([3.0, 4.0]) / 13, "the first gradient after clipping to max_norm = 1", atol=1e-4,
              pick=lambda o: o[1])
    t.compare(f104, T([0.0, 12.0]) / 13, "the second gradient after clipping to max_norm = 1", atol=1e-4,
              pick=lambda o: o[2])
    # a non-default eps: the factor is max_norm / (norm + eps)
    def eps_probe(impl):
        a = torch.nn.Parameter(torch.zeros(2))
        a.grad = torch.tensor([3.0, 4.0])
        with _clip_forbidden():
            impl.clip_grad_norm([a], 1.0, eps=0.5)
        return a.grad

    t.compare(eps_probe, T([3.0, 4.0]) / 5.5, "gradient [3, 4] clipped with max_norm=1, eps=0.5 (factor "
              "max_norm / (norm + eps) = 1/5.5)", atol=1e-5)

    # only a norm *above* max_norm is clipped: at exactly max_norm the gradients stay bit for bit
    def at_limit(impl):
        a = torch.nn.Parameter(torch.zeros(2))
        a.grad = torch.tensor([3.0, 4.0])
        with _clip_forbidden():
            impl.clip_grad_norm([a], 5.0)
        return a.grad

    t.compare(at_limit, T([3.0, 4.0]), "gradient [3, 4] (norm 5) with max_norm=5: not above the limit, left unchanged",
              atol=0, rtol=0)

    # no gradient at all: the global norm of nothing is 0
    def no_grads(impl):
        a = torch.nn.Parameter(torch.zeros(2))
        with _clip_forbidden():
            return float(impl.clip_grad_norm([a], 1.0))

    t.compare(no_grads, 0.0, "clip_grad_norm of parameters that all have .grad None (the global norm of nothing)",
              atol=0, rtol=0)
    # against torch.nn.utils.clip_grad_norm_ on a small network, parameters passed as a generator
    for seed, max_norm, frozen in ((0, 0.5, False), (1, 0.05, True), (2, 1e4, False)):
        net = _tiny_grads(seed)
        if frozen:
            net[0].bias.grad = None
        want_norm = float(torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm))
        want = [p.grad for p in net.parameters() if p.grad is not None]
        probe = _clip_probe(seed, max_norm, frozen)
        got_norm, got = t.run(probe)
        t.expect(abs(float(got_norm) - want_norm) <= 1e-5 * max(1.0, want_norm),
                 f"returned norm {float(got_norm):.6g}, expected the global norm before clipping {want_norm:.6g} "
                 f"(seed {seed}{', one parameter without a gradient' if frozen else ''})")
        unchanged = [p.grad for p in _tiny_grads(seed).parameters() if p.grad is not None]
        if max_norm < want_norm and all(torch.allclose(a, b) for a, b in zip(got, unchanged)):
            t.fail("the norm is right but the gradients were not rescaled; note that `parameters` may be a generator "
                   "(model.parameters()), which is empty after the first pass: read it into a list first")
        t.compare(probe, want, f"the clipped gradients (max_norm = {max_norm:g}, global norm {want_norm:.4g})",
                  atol=1e-6, rtol=1e-5, pick=lambda o: o[1])


# ================================================================== 10.configure_optimizer


def _char_tiny(seed=0):
    from llmcourse.models.gpt2 import GPT2Config, GPT2Model

    torch.manual_seed(seed)
    return GPT2Model(GPT2Config.preset("gpt2-char-tiny"))


def _group_facts(impl):
    model = _char_tiny()
    opt = impl.configure_optimizer(model, 3e-4, 0.1)
    names = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), n)
    groups = []
    for g in opt.param_groups:
        groups.append({"names": [names.get(id(p), "?") for p in g["params"]], "weight_decay": float(g["weight_decay"]),
                       "lr": float(g["lr"]), "betas": [float(b) for b in g.get("betas", (math.nan, math.nan))],
                       "numel": sum(p.numel() for p in g["params"])})
    return {"type": type(opt).__name__, "groups": groups}


def _decay_step(lr, wd):
    def probe(impl):
        model = _char_tiny()
        opt = impl.configure_optimizer(model, lr, wd)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)  # Adam's update is 0: only the decoupled decay moves a weight
        opt.step()
        return [p.detach().clone() for p in model.parameters()]
    return probe


@check(f"{U}.configure_optimizer", ["configure_optimizer"], _ref)
def check_configure_optimizer(t):
    model = _char_tiny()
    decay = [n for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [n for n, p in model.named_parameters() if p.dim() < 2]
    facts = t.run(_group_facts)
    t.expect(facts["type"] == "AdamW", f"configure_optimizer must return torch.optim.AdamW; got {facts['type']}")
    groups = facts["groups"]
    t.expect(len(groups) == 2, f"expected two parameter groups (decay, no decay); got {len(groups)}")
    listed = [n for g in groups for n in g["names"]]
    dup = sorted({n for n in listed if listed.count(n) > 1})
    t.expect(not dup, f"{dup} listed more than once: the tied embedding / head weight is one tensor and must appear "
             "exactly once", bug="B10.tied_in_two_groups")
    g0, g1 = groups
    by_name = [n for n, p in model.named_parameters() if n.endswith("weight")]
    if set(g0["names"]) == set(by_name) != set(decay):
        t.fail(f"group 0 holds every tensor named '…weight', LayerNorm gains included ({len(by_name)} tensors); the "
               "gains act on each feature alone and must not be decayed", bug="B10.decay_by_name")
    t.expect(g1["weight_decay"] == 0.0, f"group 1 (not decayed) must have weight_decay 0.0; got "
             f"{g1['weight_decay']}", bug="B10.decay_everything" if set(g1["names"]) == set(no_decay) else None)
    t.expect(set(g0["names"]) == set(decay),
             f"group 0 must hold exactly the tensors that mix features ({len(decay)} tensors); missing "
             f"{sorted(set(decay) - set(g0['names']))[:4]}, unexpected {sorted(set(g0['names']) - set(decay))[:4]}",
             bug="B10.decay_everything" if set(g0["names"]) >= set(decay) else None)
    t.expect(set(g1["names"]) == set(no_decay),
             f"group 1 must hold exactly the tensors that act on each feature alone ({len(no_decay)} tensors)")
    t.expect((g0["numel"], g1["numel"]) == (802_944, 6_912),
             f"for gpt2-char-tiny the groups must hold 802,944 and 6,912 parameters; got {g0['numel']:,} and "
             f"{g1['numel']:,}")
    t.expect(g0["weight_decay"] == 0.1, f"group 0 must use the weight_decay argument (0.1); got {g0['weight_decay']}")
    t.expect(all(g["lr"] == 3e-4 for g in groups), "both groups must use the lr argument")
    t.expect(all(g["betas"] == [0.9, 0.95] for g in groups), f"betas must default to (0.9, 0.95); got "
             f"{[g['betas'] for g in groups]}")
    # non-default weight_decay and betas are passed on
    def custom(impl):
        opt = impl.configure_optimizer(_char_tiny(), 1e-3, weight_decay=0.05, betas=(0.8, 0.9))
        return [[float(g["weight_decay"]), [float(b) for b in g["betas"]], float(g["lr"])] for g in opt.param_groups]

    t.compare(custom, [[0.05, [0.8, 0.9], 1e-3], [0.0, [0.8, 0.9], 1e-3]],
              "configure_optimizer(model, 1e-3, weight_decay=0.05, betas=(0.8, 0.9)): [weight_decay, betas, lr] of "
              "each group", atol=1e-12)
    # the rule must hold for any model, so names must not decide (issue 38: `endswith("bias") or "norm" in name`
    # earned 3/3 on GPT-2's names): a 1-D gain called `proj_weight`, a matrix called `norm_mix`, a Linear called
    # `norm` (its weight mixes features, its bias does not)
    def misleading(impl):
        class Misleading(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj_weight = nn.Parameter(torch.ones(6))
                self.norm_mix = nn.Parameter(torch.randn(6, 6))
                self.norm = nn.Linear(6, 6)
                self.bias_table = nn.Embedding(5, 6)

            def forward(self, x):
                return self.norm(x @ self.norm_mix * self.proj_weight)

        m = Misleading()
        names = {id(p): n for n, p in m.named_parameters()}
        opt = impl.configure_optimizer(m, 1e-3)
        return [sorted(names.get(id(p), "?") for p in g["params"]) for g in opt.param_groups]

    want_mis = [["bias_table.weight", "norm.weight", "norm_mix"], ["norm.bias", "proj_weight"]]
    got_mis = t.run(misleading)
    t.expect(got_mis == want_mis, f"on a model whose names mislead (a 1-D gain `proj_weight`, a matrix `norm_mix`, a "
             f"Linear called `norm`, an embedding `bias_table`) the groups must be {want_mis}; got {got_mis}: decide "
             "from what each tensor does (its shape), not from its name", bug="B10.decay_by_name")
    # what the optimizer does: one step with zero gradients moves only the decayed weights, by (1 − lr·wd)
    lr, wd = 0.5, 0.2
    expected = [p.detach() * (1 - lr * wd) if p.dim() >= 2 else p.detach().clone() for p in model.parameters()]
    t.compare(_decay_step(lr, wd), expected, f"the weights after one AdamW step with zero gradients (lr={lr}, "
              f"weight_decay={wd}): matrices shrink by 1 − lr·wd = {1 - lr * wd:g}, vectors stay", atol=1e-6)


# ================================================================== 10.train_steps (+ checkpoints, estimate_loss)

TINY = dict(vocab_size=13, context_length=16, d_model=16, n_heads=2, n_layers=2)
DATA = torch.randint(0, 13, (400,), generator=torch.Generator().manual_seed(5))


def _gpt(dropout=0.0, seed=0):
    from llmcourse.models.gpt2 import GPT2Config, GPT2Model

    torch.manual_seed(seed)
    return GPT2Model(GPT2Config(**TINY, dropout=dropout))


def _weights(model):
    return [p.detach().clone() for p in model.parameters()]


def _grads_here(weights, s_seed, b=4, tt=8):
    """Gradient of the mean next-token loss at ``weights`` on the batch of generator seed ``s_seed`` (here)."""
    model = _gpt()
    with torch.no_grad():
        for p, w in zip(model.parameters(), weights):
            p.copy_(w)
    g = torch.Generator().manual_seed(s_seed)
    x, y = _windows(DATA, torch.randint(0, len(DATA) - tt, (b,), generator=g).tolist(), tt)
    logits = model(x)
    F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def _global(ts):
    return float(torch.sqrt(sum((t_ ** 2).sum() for t_ in ts)))


def _sgd_probe(n_steps, max_norm, lr=0.1, seed=3):
    def probe(impl):
        model = _gpt()
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        losses = impl.train_steps(model, opt, DATA, n_steps, 0, 4, 8, lambda s: lr, max_norm, seed)
        return losses, _weights(model)
    return probe


def _adamw_probe(impl):
    model = _gpt()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=1.0)
    losses = impl.train_steps(model, opt, DATA, 3, 3, 4, 8, lambda s: 1e-3 * (s - 2), 0.5, 7)
    return [torch.tensor(losses, dtype=torch.float64), *_weights(model)]


def _repeat_probe(impl):
    model = _gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    window = DATA[:9]  # len T + 1: every batch is the same window
    return impl.train_steps(model, opt, window, 15, 0, 4, 8, lambda s: 3e-2, 1.0, 0)


def _resume_probe(impl):
    import os
    import tempfile

    def lr_fn(s):
        return 3e-3 * (1 + s) / 10

    def fresh(seed):
        m = _gpt(dropout=0.1, seed=seed)
        return m, torch.optim.AdamW(m.parameters(), lr=0.0, weight_decay=0.1)

    out = {}
    m, opt = fresh(1)
    torch.manual_seed(21)
    out["full"] = impl.train_steps(m, opt, DATA, 8, 0, 4, 8, lr_fn, 1.0, 5)
    m, opt = fresh(1)
    torch.manual_seed(21)
    out["first"] = impl.train_steps(m, opt, DATA, 4, 0, 4, 8, lr_fn, 1.0, 5)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "ckpt.pt")
        impl.save_checkpoint(path, m, opt, 4, {"lr": 3e-3, "note": "resume test"})
        try:
            raw = torch.load(path, map_location="cpu", weights_only=True)
            out["keys"] = sorted(raw) if isinstance(raw, dict) else None
            out["saved_step"] = raw.get("step") if isinstance(raw, dict) else None
            out["load_error"] = ""
        except Exception as exc:  # noqa: BLE001 - reported by the check
            out["keys"], out["load_error"] = None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            return out
        torch.manual_seed(999)  # a new process: the global generator is elsewhere
        m2, opt2 = fresh(2)     # different initial weights: loading must overwrite them
        out["step"] = impl.load_checkpoint(path, m2, opt2)
        out["second"] = impl.train_steps(m2, opt2, DATA, 4, int(out["step"]), 4, 8, lr_fn, 1.0, 5)
    return out


def _eval_probe(impl):
    model = _gpt(dropout=0.3, seed=4)
    model.train()
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    seen = []  # per forward: (output tracks gradients, model in train mode)
    model.register_forward_hook(lambda m, i, o: seen.append((bool(o.requires_grad), bool(m.training))))
    torch.manual_seed(0)
    a = impl.estimate_loss(model, DATA, 4, 8, 3, 17)
    mode_after_train = model.training
    torch.manual_seed(1)
    b = impl.estimate_loss(model, DATA, 4, 8, 3, 17)
    model.eval()
    c = impl.estimate_loss(model, DATA, 4, 8, 3, 17)
    moved = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    return float(a), float(b), mode_after_train, float(c), model.training, seen, moved


def _train_mode_probe(impl):
    """One step of train_steps on a dropout model handed over in eval mode: its loss, and the mode after."""
    model = _gpt(dropout=0.5, seed=6)
    model.eval()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    torch.manual_seed(2)
    losses = impl.train_steps(model, opt, DATA, 2, 0, 4, 8, lambda s: 0.0, 1.0, 9)
    return losses, model.training


@check(f"{U}.train_steps", ["save_checkpoint", "load_checkpoint", "train_steps", "estimate_loss"], _ref)
def check_train_steps(t):
    # 1. clipping happens before the update: with SGD the step is exactly -lr · clipped gradient
    losses, w1 = t.run(_sgd_probe(1, 1e-3))
    t.expect(isinstance(losses, list) and len(losses) == 1 and all(isinstance(v, float) for v in losses),
             f"train_steps must return a list with one float loss per step; got {losses!r}"[:300])
    w0 = _weights(_gpt())
    g0 = _grads_here(w0, 3)
    norm0 = _global(g0)
    step_len = _global([a - b for a, b in zip(w1, w0)])
    if step_len > 2 * 0.1 * 1e-3:
        near_unclipped = abs(step_len - 0.1 * norm0) < 0.05 * 0.1 * norm0
        t.fail(f"with SGD(lr=0.1) and max_norm=1e-3 the first update must have length lr·max_norm = 1e-4; it has "
               f"length {step_len:.3g} (lr·‖g‖ = {0.1 * norm0:.3g}): the update used unclipped gradients",
               bug="B10.clip_after_step" if near_unclipped else None)
    scale = min(1.0, 1e-3 / (norm0 + 1e-6))
    want1 = [w - 0.1 * scale * g for w, g in zip(w0, g0)]
    diff = max(float((a - b).abs().max()) for a, b in zip(w1, want1))
    t.expect(diff < 1e-6, f"the weights after one SGD step (lr=0.1) with gradients clipped to max_norm=1e-3 differ "
             f"from -lr × clipped gradient by up to {diff:.3g}")
    # 2. every step starts from zero gradients
    _, w2 = t.run(_sgd_probe(2, 1e9))
    w1_ok = [w - 0.1 * g for w, g in zip(w0, g0)]
    g1 = _grads_here(w1_ok, 4)
    fresh = [w - 0.1 * g for w, g in zip(w1_ok, g1)]
    summed = [w - 0.1 * (a + b) for w, a, b in zip(w1_ok, g0, g1)]
    if not all(torch.allclose(a, b, atol=1e-5) for a, b in zip(w2, fresh)):
        accumulated = all(torch.allclose(a, b, atol=1e-5) for a, b in zip(w2, summed))
        t.fail("with SGD(lr=0.1) and no clipping, the second update must be -lr × the gradient of the second batch"
               + ("; it is -lr × (first + second gradient): the gradients accumulate across steps" if accumulated
                  else ""), bug="B10.no_zero_grad" if accumulated else None)
    # 3. the reference with AdamW, two parameter groups, a changing lr and active clipping
    want = _adamw_probe(t.reference)
    t.compare(_adamw_probe, want, "the losses (first entry) and the weights after steps 3, 4, 5 (AdamW with two groups, "
              "lr_fn(s) = 1e-3·(s − 2), max_norm = 0.5, seed 7)", atol=1e-5)
    # 4. the loss falls on a repeated tiny batch
    rep = t.run(_repeat_probe)
    t.expect(len(rep) == 15 and rep[-1] < 0.5 * rep[0], f"training 15 steps on one repeated batch must at least halve "
             f"the loss; it went from {rep[0]:.3f} to {rep[-1]:.3f}")
    # 5. exact resumption: 8 steps = 4 steps, checkpoint, fresh model and optimizer, load, 4 steps (dropout 0.1)
    r = t.run(_resume_probe)
    t.expect(not r.get("load_error"), "the checkpoint must load with torch.load(path, map_location='cpu', "
             f"weights_only=True); it raised {r.get('load_error')}: save state dicts and plain data, never a module")
    keys = r["keys"]
    want_keys = ["config", "model", "optimizer", "step", "torch_rng"]
    t.expect(keys is not None, "the checkpoint must be a dict")
    t.expect("optimizer" in keys, f"the checkpoint has keys {keys}: the optimizer state is missing",
             bug="B10.ckpt_no_optimizer")
    t.expect("torch_rng" in keys, f"the checkpoint has keys {keys}: the torch RNG state is missing",
             bug="B10.ckpt_no_rng")
    t.expect(keys == want_keys, f"the checkpoint must have exactly the keys {want_keys}; got {keys}")
    t.expect(r["saved_step"] == 4 and r["step"] == 4, f"save_checkpoint(..., step=4, ...) then load_checkpoint must "
             f"return 4; stored {r['saved_step']!r}, returned {r['step']!r}")
    full, first, second = r["full"], r["first"], r["second"]
    t.expect(all(abs(a - b) <= 1e-6 for a, b in zip(full[:4], first)),
             "two runs from the same seeds must give the same first four losses")
    if not all(abs(a - b) <= 1e-6 for a, b in zip(full[4:], second)):
        diffs = [round(a - b, 6) for a, b in zip(full[4:], second)]
        t.fail(f"steps 4–7 after loading the checkpoint into a fresh model and optimizer differ from the uninterrupted "
               f"run by {diffs}: load_checkpoint must restore the model, the optimizer and torch's RNG state")
    # 6. train mode: a dropout model handed over in eval mode must train with dropout on (lr 0: weights fixed)
    losses_tm, mode_tm = t.run(_train_mode_probe)
    model = _gpt(dropout=0.5, seed=6).eval()
    with torch.no_grad():
        eval_losses = []
        for s_ in range(2):
            g = torch.Generator().manual_seed(9 + s_)
            x, y = _windows(DATA, torch.randint(0, len(DATA) - 8, (4,), generator=g).tolist(), 8)
            eval_losses.append(float(F.cross_entropy(model(x).reshape(-1, 13), y.reshape(-1))))
    no_dropout = all(abs(a_ - b_) < 1e-6 for a_, b_ in zip(losses_tm, eval_losses))
    t.expect(not no_dropout and mode_tm is True, "train_steps on a model with dropout 0.5 that arrives in eval mode: "
             + ("its losses equal the eval-mode losses, so dropout was off during training; "
                if no_dropout else f"afterwards model.training is {mode_tm}; ")
             + "put the model in train mode at the start of train_steps", bug="B10.no_train_mode")
    # 7. estimate_loss: eval mode, no randomness, no autograd, the previous mode restored
    a, b, mode_after, c, mode_eval, seen, moved = t.run(_eval_probe)
    t.expect(not moved, f"estimate_loss changed the model's weights or buffers: {moved[:4]} (evaluation only reads)")
    if seen and any(training for _, training in seen[:3]):
        t.fail("estimate_loss ran the model in train mode (dropout on, so the estimate is noisy and too high); "
               "switch to eval() for the evaluation", bug="B10.eval_in_train_mode")
    if seen and any(grad for grad, _ in seen):
        t.fail("estimate_loss ran the model with autograd on (its outputs track gradients, building a graph nobody "
               "uses); evaluate under torch.no_grad()", bug="B10.eval_with_grad")
    model = _gpt(dropout=0.3, seed=4).eval()
    with torch.no_grad():
        want = 0.0
        for i in range(3):
            g = torch.Generator().manual_seed(17 + i)
            x, y = _windows(DATA, torch.randint(0, len(DATA) - 8, (4,), generator=g).tolist(), 8)
            want += float(F.cross_entropy(model(x).reshape(-1, 13), y.reshape(-1))) / 3
    t.expect(abs(a - b) < 1e-6, f"two evaluations of the same model gave {a:.6f} and {b:.6f}: dropout is still on; "
             "evaluate in eval mode")
    t.expect(abs(a - want) < 1e-5, f"estimate_loss over 3 batches (seeds 17, 18, 19, B=4, T=8): expected the mean loss "
             f"{want:.6f} in eval mode, got {a:.6f}")
    t.expect(mode_after is True, "after estimate_loss a model that was training must be back in train mode",
             bug="B10.eval_not_restored")
    t.expect(abs(c - want) < 1e-5 and mode_eval is False, "a model in eval mode must stay in eval mode")


# ================================================================== siblings
# Library objects that give these exercises' answers without going through the reference: blocked in
# the worker like the reference (grader.runner.also_blocked; tests/test_blocked_siblings.py).
# configure_optimizer: the decay/no-decay split
also_blocked(f"{U}.configure_optimizer", "llmcourse.train.optim:parameter_groups")
# train_steps: one step of train_steps, and unit 17's copy of estimate_loss
also_blocked(f"{U}.train_steps", "llmcourse.train.pretraining:train_step", "llmcourse.models.deepseek:_val_loss")


# ================================================================== grading strength (grader/strength.py)
defining_property(f"{U}.get_batch", "training windows and their next-token targets, offsets drawn by one seeded call",
                  probe="x and y from known streams (y = x shifted), offsets of a seeded generator, long dtype")
defining_property(f"{U}.lm_loss", "the mean next-token cross-entropy over the counted positions; perplexity its exp",
                  probe="vs F.cross_entropy on flattened positions with ignore_index; uniform logits give ln V")
defining_property(f"{U}.warmup_cosine_lr", "a linear warm-up whose first step moves, a cosine decay reaching min_lr "
                  "at total_steps, then constant", probe="the schedule at every step of several settings, "
                  "warmup_steps = 0 included; continuity, symmetry and zero slope at the decay's ends")
defining_property(f"{U}.clip_grad_norm", "all gradients rescaled together by their global norm, in place",
                  probe="gradients after clipping; the returned norm before clipping; a generator of parameters")
defining_property(f"{U}.configure_optimizer", "decay only the tensors that mix features, decided by what a tensor "
                  "does (its shape), for any model", probe="the groups of GPT-2 and of a model whose names mislead; "
                  "one AdamW step with zero gradients shrinks exactly the decayed tensors")
defining_property(f"{U}.train_steps", "the training step in the right order (zero_grad, forward, loss, backward, clip, "
                  "step) with the scheduled lr, and an exact resume from a checkpoint", probe="losses and weights "
                  "against a reference loop; SGD updates show accumulation; 10 steps vs 5 + checkpoint + 5 with dropout")
decision(f"{U}.configure_optimizer", "which tensors are decayed: those that mix features (matrices, ndim >= 2), not "
         "the per-feature gains and biases",
         forms=[r"matrices (are )?decayed", r"\.dim\(\) ?>= ?2", r"\.ndim ?>= ?2", r"0\.1 on matrices",
                r"vectors (are )?not decayed", r"decays matrices( only)?", r"decay (only )?(the )?(2-?D|two-dimensional) (tensors|parameters)"],
         wrong=("B10.decay_by_name", "B10.decay_everything"))
decision(f"{U}.warmup_cosine_lr", "the formula of each phase (the warm-up's first step, the cosine's argument)",
         forms=[r"\(step ?\+ ?1\) ?/ ?warmup_steps", r"max_lr ?\* ?\(step ?\+ ?1\)",
                r"1 ?\+ ?(math\.)?cos\((math\.)?pi ?\* ?progress"],
         wrong=("B10.warmup_from_zero", "B10.linear_decay", "B10.cosine_to_zero"))
