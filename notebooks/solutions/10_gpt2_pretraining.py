# %% [markdown]
# # Unit 10 — Pretraining a GPT: exercises
#
# Six graded exercises, 20 points. Each one has a **task**, a cell for your code (replace
# `raise NotImplementedError()`), and a **test cell** with quick visible checks. Run the test cell
# after each exercise; it prints `visible tests passed` when the basics hold.
#
# The grader runs more checks than you see here: worked examples, comparisons with PyTorch's own
# functions (`F.cross_entropy`, `torch.nn.utils.clip_grad_norm_`), predictions of the weights after an
# optimizer step, and properties of the whole loop (the update length under clipping, no gradient
# accumulation, exact resumption from a checkpoint with dropout on). When something fails it tells you
# what was expected, what came back, and, if your mistake is a known one, its name and a hint.
#
# **Check your work** at any time: save the notebook, then run in a terminal
#
# ```
# course check exercises/10_gpt2_pretraining/10_gpt2_pretraining.ipynb
# ```
#
# The grader reads only your `import`, `def` and `class` statements, so a function must not rely on
# a variable defined elsewhere in the notebook. Use `torch`, `math` and the standard library; the model
# (`GPT2Model`, unit 08) is imported below for the tests. Exercise 6 uses your functions from
# exercises 1–4.

# %%
import math  # noqa: F401

import torch
import torch.nn.functional as F
from torch import nn  # noqa: F401

import llmcourse
from llmcourse.models.gpt2 import GPT2Config, GPT2Model

cfg = llmcourse.setup_notebook("10")

# %% [markdown]
# ## Exercise 1 — `get_batch` (3 points)
#
# Cut a batch of training windows out of one long stream of token ids:
#
# ```python
# get_batch(data: Tensor, batch_size: int, context_length: int, generator: torch.Generator)
#     -> tuple[Tensor, Tensor]
# ```
#
# - Draw the `B` start offsets with **exactly this call** (so a seeded generator gives the same batch
#   everywhere): `torch.randint(0, len(data) - context_length, (batch_size,), generator=generator)`.
# - Row `b` of `x` is `data[o_b : o_b + T]`, row `b` of `y` is `data[o_b + 1 : o_b + T + 1]`.
# - Return `(x, y)`, both `(B, T)` and `torch.long` (also when `data` has another integer dtype).
#
# Example: `data = torch.arange(100)`, `B = 2`, `T = 4`, `torch.Generator().manual_seed(0)` gives the
# offsets `[44, 15]`, so `x = [[44, 45, 46, 47], [15, 16, 17, 18]]` and `y = x + 1`.

# %% tags=["solution:10.get_batch"]
def get_batch(data, batch_size, context_length, generator):
    """(x, y), each (B, T) long: random windows of `data` and the same windows shifted by one."""
    ### BEGIN SOLUTION
    offsets = torch.randint(0, len(data) - context_length, (batch_size,), generator=generator)
    x = torch.stack([data[o:o + context_length] for o in offsets.tolist()])
    y = torch.stack([data[o + 1:o + context_length + 1] for o in offsets.tolist()])
    return x.long(), y.long()
    ### END SOLUTION


# %% tags=["tests:10.get_batch"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("10.get_batch")  # noqa: E702
### END HIDDEN TESTS
x, y = get_batch(torch.arange(100), 2, 4, torch.Generator().manual_seed(0))
assert x.shape == (2, 4) and x.dtype == torch.long, f"x: expected (2, 4) long, got {tuple(x.shape)} {x.dtype}"
assert x.tolist() == [[44, 45, 46, 47], [15, 16, 17, 18]], f"offsets must be [44, 15]; got x = {x.tolist()}"
assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y, x + 1), "y must be x shifted by one token"
print("visible tests passed")

# %% [markdown]
# ## Exercise 2 — `lm_loss` and `perplexity` (2 points)
#
# ```python
# lm_loss(logits: Tensor, targets: Tensor, ignore_index: int = -100) -> Tensor   # (B, T, V), (B, T) -> 0-d
# perplexity(mean_loss: float) -> float
# ```
#
# - `lm_loss`: the mean cross-entropy over every position of every sequence (positions whose target
#   is `ignore_index` do not count), as a 0-d tensor you can call `.backward()` on. Mind the layout
#   `F.cross_entropy` expects for its class dimension.
# - `perplexity`: `exp(mean_loss)`, a Python float.
#
# A model that predicts the uniform distribution over `V` tokens has loss `ln V` and perplexity `V`.

# %% tags=["solution:10.lm_loss"]
def lm_loss(logits, targets, ignore_index=-100):
    """Mean next-token cross-entropy: logits (B, T, V), targets (B, T) -> 0-d tensor."""
    ### BEGIN SOLUTION
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=ignore_index)
    ### END SOLUTION


def perplexity(mean_loss):
    """exp(mean_loss) as a float."""
    ### BEGIN SOLUTION
    return math.exp(float(mean_loss))
    ### END SOLUTION


# %% tags=["tests:10.lm_loss"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("10.lm_loss")  # noqa: E702
### END HIDDEN TESTS
uniform = lm_loss(torch.zeros(2, 3, 65), torch.randint(0, 65, (2, 3)))
assert uniform.dim() == 0, f"lm_loss must return a 0-d tensor, got shape {tuple(uniform.shape)}"
assert abs(uniform.item() - math.log(65)) < 1e-6, f"uniform logits over 65 tokens must give ln 65; got {uniform.item()}"
assert abs(perplexity(math.log(65)) - 65) < 1e-9, "perplexity(ln 65) must be 65"
z, tg = torch.randn(2, 5, 7), torch.randint(0, 7, (2, 5))
assert torch.allclose(lm_loss(z, tg), F.cross_entropy(z.reshape(10, 7), tg.reshape(10))), "every position weighs the same"
print("visible tests passed")

# %% [markdown]
# ## Exercise 3 — `warmup_cosine_lr` (4 points)
#
# The learning rate of optimizer step `step` (counting from 0), as a Python float:
#
# ```python
# warmup_cosine_lr(step, max_lr, min_lr, warmup_steps, total_steps) -> float
# ```
#
# The schedule the course trains with (section 5 of the lesson shows its shape) has three phases: a
# warm-up over the first `warmup_steps` steps, a decay that reaches `min_lr` exactly at `total_steps`,
# and `min_lr` from then on. **Work out the formula of each phase from these required values**
# (`max_lr=1e-3, min_lr=1e-4, warmup_steps=10, total_steps=90`; the hidden check tests many more steps and
# other settings, including `warmup_steps=0`):
#
# | step | 0 | 4 | 9 | 10 | 30 | 50 | 70 | 90 | 150 |
# |---|---|---|---|---|---|---|---|---|---|
# | lr | 1e-4 | 5e-4 | 1e-3 | 1e-3 | 8.68198e-4 | 5.5e-4 | 2.31802e-4 | 1e-4 | 1e-4 |
#
# Properties that hold for every setting: the warm-up is linear in the step and its first step already
# moves; the lr is continuous at `warmup_steps` and never increases after it; the decay is symmetric
# about its midpoint (the lr at the midpoint is the mean of `max_lr` and `min_lr`, and steps equally far
# before and after it sit equally far above and below that mean), with zero slope at both of its ends.

# %% tags=["solution:10.warmup_cosine_lr"]
def warmup_cosine_lr(step, max_lr, min_lr, warmup_steps, total_steps):
    """Linear warm-up to max_lr, cosine decay to min_lr at total_steps, then constant."""
    ### BEGIN SOLUTION
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step > total_steps:
        return min_lr
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * progress))
    ### END SOLUTION


# %% tags=["tests:10.warmup_cosine_lr"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("10.warmup_cosine_lr")  # noqa: E702
### END HIDDEN TESTS
got = [warmup_cosine_lr(s, 1e-3, 1e-4, 10, 90) for s in (0, 4, 9, 10, 30, 50, 70, 90, 150)]
want = [1e-4, 5e-4, 1e-3, 1e-3, 8.68198e-4, 5.5e-4, 2.31802e-4, 1e-4, 1e-4]
assert all(abs(g - w) < 1e-9 for g, w in zip(got, want)), f"expected {want}, got {got}"
decay = [warmup_cosine_lr(s, 1e-3, 1e-4, 10, 90) for s in range(10, 200)]
assert all(a >= b for a, b in zip(decay, decay[1:])), "after warm-up the lr must never increase"
print("visible tests passed")

# %% [markdown]
# ## Exercise 4 — `clip_grad_norm` (3 points)
#
# Clip by the **global** norm, in place, without `torch.nn.utils.clip_grad_norm_`:
#
# ```python
# clip_grad_norm(parameters, max_norm: float, eps: float = 1e-6) -> float
# ```
#
# - `norm` = the L2 norm of all gradients taken together, `sqrt(Σ_p ‖p.grad‖²)`; parameters whose
#   `.grad` is `None` are skipped.
# - If `norm > max_norm`, multiply **every** gradient by `max_norm / (norm + eps)`.
# - Return the norm **before** clipping, as a float.
# - `parameters` may be a generator (`model.parameters()`), which can be read only once.
#
# Example: gradients `[3, 4]` and `[0, 12]` have the global norm 13; with `max_norm = 1` the function
# returns 13.0 and leaves `[0.2308, 0.3077]` and `[0, 0.9231]`.

# %% tags=["solution:10.clip_grad_norm"]
@torch.no_grad()
def clip_grad_norm(parameters, max_norm, eps=1e-6):
    """Rescale all gradients together so their global L2 norm is at most max_norm; return the old norm."""
    ### BEGIN SOLUTION
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    norm = math.sqrt(sum(float((g.float() ** 2).sum()) for g in grads))
    if norm > max_norm:
        for g in grads:
            g.mul_(max_norm / (norm + eps))
    return norm
    ### END SOLUTION


# %% tags=["tests:10.clip_grad_norm"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("10.clip_grad_norm")  # noqa: E702
### END HIDDEN TESTS
a, b = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(2))
a.grad, b.grad = torch.tensor([3.0, 4.0]), torch.tensor([0.0, 12.0])
norm = clip_grad_norm(iter([a, b]), max_norm=1.0)
assert abs(float(norm) - 13.0) < 1e-5, f"the global norm before clipping is 13; got {norm}"
assert torch.allclose(a.grad, torch.tensor([3.0, 4.0]) / 13, atol=1e-4), f"first gradient: got {a.grad.tolist()}"
assert torch.allclose(b.grad, torch.tensor([0.0, 12.0]) / 13, atol=1e-4), f"second gradient: got {b.grad.tolist()}"
new_norm = math.sqrt(float(a.grad.pow(2).sum() + b.grad.pow(2).sum()))
assert abs(new_norm - 1.0) < 1e-4, f"after clipping the global norm must be max_norm = 1; it is {new_norm:.5f}"
print("visible tests passed")

# %% [markdown]
# ## Exercise 5 — `configure_optimizer` (3 points)
#
# ```python
# configure_optimizer(model, lr, weight_decay=0.1, betas=(0.9, 0.95)) -> torch.optim.AdamW
# ```
#
# Two parameter groups, in this order: group 0 with `weight_decay=weight_decay`, group 1 with
# `weight_decay=0.0`; both use `lr` and `betas`. **You decide which tensors go where**, from the property the
# split must have: AdamW's decay pulls a tensor toward 0 at every step, which is a sensible prior only for
# tensors that *mix* features (one output from many inputs, or a lookup table of vectors). A tensor that
# acts on each feature on its own, shifting or rescaling it, must not be pulled toward 0: a LayerNorm gain
# of 0 switches its feature off, and nothing in the data asks for that (the lesson, section 4, measures the
# pull). The rule must work for any model, not only GPT-2's names.
#
# Evidence: for `gpt2-char-tiny` the groups hold 802,944 and 6,912 values. Each tensor appears **exactly
# once**: GPT-2's output head shares its weight with the token embedding, and `torch.optim` refuses a tensor
# that sits in two groups.

# %% tags=["solution:10.configure_optimizer"]
def configure_optimizer(model, lr, weight_decay=0.1, betas=(0.9, 0.95)):
    """AdamW with two parameter groups: group 0 decayed with weight_decay, group 1 not decayed."""
    ### BEGIN SOLUTION
    params = [p for p in model.parameters() if p.requires_grad]  # parameters() yields a shared tensor once
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas)
    ### END SOLUTION


# %% tags=["tests:10.configure_optimizer"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("10.configure_optimizer")  # noqa: E702
### END HIDDEN TESTS
tiny = GPT2Model(GPT2Config.preset("gpt2-char-tiny"))
opt = configure_optimizer(tiny, lr=3e-4)
sizes = [sum(p.numel() for p in g["params"]) for g in opt.param_groups]
assert sizes == [802_944, 6_912], f"group sizes must be [802944, 6912]; got {sizes}"
assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0], "weight decay: weight_decay (0.1) in group 0, 0.0 in group 1"
assert tuple(opt.param_groups[0]["betas"]) == (0.9, 0.95), "betas default to (0.9, 0.95)"
print("visible tests passed")

# %% [markdown]
# ## Exercise 6 — the training loop, checkpoints and evaluation (5 points)
#
# Four functions. The loop uses your `get_batch`, `lm_loss` and `clip_grad_norm` from above.
#
# ```python
# train_steps(model, optimizer, data, n_steps, start_step, batch_size, context_length, lr_fn, max_norm, seed)
#     -> list[float]
# ```
#
# Put the model in train mode. For each step `s` in `range(start_step, start_step + n_steps)`:
# draw the batch with `get_batch(data, batch_size, context_length, torch.Generator().manual_seed(seed + s))`;
# set `lr_fn(s)` as the `"lr"` of **every** parameter group; then `zero_grad` → forward → `lm_loss` →
# `backward` → `clip_grad_norm(model.parameters(), max_norm)` → `optimizer.step()`. Return the list of
# the `n_steps` losses as Python floats.
#
# ```python
# save_checkpoint(path, model, optimizer, step, config) -> None
# load_checkpoint(path, model, optimizer) -> int
# ```
#
# `save_checkpoint` writes with `torch.save` a dict with exactly the keys `"model"` (the model's state
# dict), `"optimizer"` (the optimizer's state dict), `"step"`, `"config"` and `"torch_rng"`
# (`torch.get_rng_state()`). `load_checkpoint` reads it with
# `torch.load(path, map_location="cpu", weights_only=True)`, restores the model, the optimizer **and**
# the RNG state (`torch.set_rng_state`), and returns the step. Resuming must be exact: 10 steps in one
# go give the same losses as 5 steps, a checkpoint, a fresh model and optimizer loaded from it, and 5
# more steps, even with dropout on.
#
# ```python
# estimate_loss(model, data, batch_size, context_length, n_batches, seed=0) -> float
# ```
#
# The mean of `lm_loss` over `n_batches` batches, batch `i` drawn with
# `torch.Generator().manual_seed(seed + i)`; computed in `eval()` mode without gradients, and the model's
# previous mode restored afterwards.

# %% tags=["solution:10.train_steps"]
def train_steps(model, optimizer, data, n_steps, start_step, batch_size, context_length, lr_fn, max_norm, seed):
    """Steps start_step … start_step+n_steps−1; batch of step s from a generator seeded with seed + s."""
    ### BEGIN SOLUTION
    model.train()
    losses = []
    for s in range(start_step, start_step + n_steps):
        x, y = get_batch(data, batch_size, context_length, torch.Generator().manual_seed(seed + s))
        for group in optimizer.param_groups:
            group["lr"] = lr_fn(s)
        optimizer.zero_grad()
        loss = lm_loss(model(x), y)
        loss.backward()
        clip_grad_norm(model.parameters(), max_norm)
        optimizer.step()
        losses.append(loss.item())
    return losses
    ### END SOLUTION


def save_checkpoint(path, model, optimizer, step, config):
    """torch.save a dict: model and optimizer state dicts, step, config, torch RNG state."""
    ### BEGIN SOLUTION
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "config": config,
                "torch_rng": torch.get_rng_state()}, path)
    ### END SOLUTION


def load_checkpoint(path, model, optimizer):
    """Restore model, optimizer and RNG state (weights_only load); return the step."""
    ### BEGIN SOLUTION
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    torch.set_rng_state(ckpt["torch_rng"])
    return ckpt["step"]
    ### END SOLUTION


@torch.no_grad()
def estimate_loss(model, data, batch_size, context_length, n_batches, seed=0):
    """Mean lm_loss over n_batches fixed batches, in eval mode; the previous mode restored."""
    ### BEGIN SOLUTION
    was_training = model.training
    model.eval()
    total = 0.0
    for i in range(n_batches):
        x, y = get_batch(data, batch_size, context_length, torch.Generator().manual_seed(seed + i))
        total += lm_loss(model(x), y).item()
    model.train(was_training)
    return total / n_batches
    ### END SOLUTION


# %% tags=["tests:10.train_steps"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("10.train_steps")  # noqa: E702
### END HIDDEN TESTS
import os  # noqa: E402
import tempfile  # noqa: E402

small = GPT2Config(vocab_size=13, context_length=16, d_model=32, n_heads=2, n_layers=2, dropout=0.1)
stream = torch.randint(0, 13, (400,), generator=torch.Generator().manual_seed(0))


def fresh_run(seed):
    torch.manual_seed(seed)
    m = GPT2Model(small)
    return m, torch.optim.AdamW(m.parameters(), lr=1e-3)


m, opt = fresh_run(0)
torch.manual_seed(1)
full = train_steps(m, opt, stream, 6, 0, 4, 8, lambda s: 1e-3, 1.0, seed=0)
assert len(full) == 6 and all(isinstance(v, float) for v in full), "train_steps returns one float per step"
m, opt = fresh_run(0)
torch.manual_seed(1)
first = train_steps(m, opt, stream, 3, 0, 4, 8, lambda s: 1e-3, 1.0, seed=0)
with tempfile.TemporaryDirectory() as tmp:
    save_checkpoint(os.path.join(tmp, "ckpt.pt"), m, opt, 3, {"note": "visible test"})
    m2, opt2 = fresh_run(123)
    step = load_checkpoint(os.path.join(tmp, "ckpt.pt"), m2, opt2)
    second = train_steps(m2, opt2, stream, 3, step, 4, 8, lambda s: 1e-3, 1.0, seed=0)
assert step == 3, f"load_checkpoint must return the saved step 3; got {step}"
assert all(abs(a - b) < 1e-6 for a, b in zip(full, first + second)), \
    f"resumed run differs: {[round(v, 5) for v in full]} vs {[round(v, 5) for v in first + second]}"
m2.train()
val = estimate_loss(m2, stream, 4, 8, 2)
assert m2.training and val == estimate_loss(m2, stream, 4, 8, 2), "estimate_loss: eval mode inside, mode restored"
print("visible tests passed")

# %% [markdown]
# ## Putting it together
#
# Not graded: your pieces train the course's small character model on tinyshakespeare for a few
# steps. The loss starts near ln 65 ≈ 4.17 and should already be falling.

# %%
from llmcourse.data.corpus import char_corpus  # noqa: E402

corpus = char_corpus()
torch.manual_seed(cfg["seed"])
model = GPT2Model(GPT2Config.preset("gpt2-char-tiny"))
optimizer = configure_optimizer(model, lr=cfg["max_lr"])
steps = cfg["exercise_steps"]
lr_fn = lambda s: warmup_cosine_lr(s, cfg["max_lr"], cfg["min_lr"], max(steps // 10, 1), steps)  # noqa: E731
losses = train_steps(model, optimizer, corpus.train, steps, 0, cfg["batch_size"], 64, lr_fn, cfg["max_norm"],
                     cfg["seed"])
val = estimate_loss(model, corpus.val, cfg["batch_size"], 64, 4)
print(f"{steps} steps: training loss {losses[0]:.3f} -> {losses[-1]:.3f}; validation loss {val:.3f} "
      f"(perplexity {perplexity(val):.1f})")

# %% [markdown]
# ## Done?
#
# Save the notebook (Ctrl+S) and run the check cell below, `llmcourse.check()`, for the full report.
