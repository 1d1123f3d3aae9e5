# %% [markdown]
# # Unit 10 — Pretraining a GPT
#
# Unit 08 built GPT-2 and unit 09 made it talk, with weights someone had already trained. This lesson
# trains them ourselves: the course's small character model (`gpt2-char-tiny`, 0.8 M parameters) learns
# Shakespeare on a laptop CPU. The code is short; the craft is in the details that make a run
# **correct, resumable and measurable**:
#
# 1. the data: a corpus through Hugging Face `datasets`, 90 / 10 split, tokens per step, epochs vs steps;
# 2. random batches drawn from a generator seeded by the step, and why that makes resumption exact;
# 3. the loss and perplexity, and the loss an untrained model must start from;
# 4. AdamW and its parameter groups (no weight decay on biases and norms; tied weights counted once);
# 5. the learning-rate schedule: linear warm-up, then a cosine down to a floor;
# 6. gradient clipping by the global norm, and logging the norm before clipping;
# 7. the training loop and an honest validation loss;
# 8. checkpoints that resume a run exactly and load with `weights_only=True`;
# 9. the run itself, with a live dashboard, samples over time, the signs of overfitting, and how busy it
#    kept the processor (achieved FLOP/s against the measured peak);
# 10. what a minute buys: batch shapes given the same wall-clock budget, and bfloat16 autocast on the CPU.
#
# The exercise notebook (`exercises/10_gpt2_pretraining/10_gpt2_pretraining.ipynb`) asks you to write
# `get_batch`, `lm_loss`/`perplexity`, `warmup_cosine_lr`, `clip_grad_norm`, `configure_optimizer` and the
# loop with its checkpoints. Here we use the finished versions from `llmcourse` and test what they
# promise. Cells marked **Spot the bug** show mistakes from popular write-ups: run them, fix the `TODO`
# cell until its self-check passes; a reference fix is folded away below each one.

# %%
import io
import math
import os
import statistics
import tempfile
import time

import datasets
import matplotlib.pyplot as plt
import torch
from IPython.display import display
from torch.utils.flop_counter import FlopCounterMode

import llmcourse
from llmcourse.data import corpus as C
from llmcourse.data import data_path
from llmcourse.models.gpt2 import GPT2Config, GPT2Model
from llmcourse.train import checkpoints as K
from llmcourse.train import optim as O
from llmcourse.train import pretraining as P
from llmcourse.train.char_model import load_gpt_char_tiny
from llmcourse.train.losses import lm_loss, perplexity
from llmcourse.train.schedules import warmup_cosine_lr
from llmcourse.viz import pretraining as viz

cfg = llmcourse.setup_notebook("10")
B, T, STEPS = cfg["batch_size"], cfg["context_length"], cfg["train_steps"]
cfg

# %% [markdown]
# ## 1. The data, through Hugging Face `datasets`
#
# `datasets` is how practitioners feed corpora to training code: a dataset is a table stored as
# **Arrow** files on disk, memory-mapped rather than loaded, and every transformation (`.map`,
# `.filter`, …) is written to a cache file named by a fingerprint of the input and the function, so a
# second run reads the result instead of recomputing it. It works offline on local files.
#
# The course's data layer finds and verifies `tinyshakespeare.txt`; `datasets`' built-in `"text"` builder
# turns it into a dataset. We ask for **one row per file** (`sample_by="document"`):

# %%
docs = C.load_document_dataset("tinyshakespeare")   # load_dataset("text", data_files=..., sample_by="document")
text = docs[0]["text"]
print(docs)
print(f"{len(text):,} characters, {len(set(text))} distinct, {text.count(chr(10)):,} newlines")
assert len(text) == 1_115_394 and len(set(text)) == 65

# %% [markdown]
# Why not the default? The `"text"` builder reads **line by line** unless told otherwise, and it strips
# each line's `"\n"`. For a character model that is fatal: the newline is one of the 65 characters, the
# one that ends every line of verse and separates speeches.

# %%
lines = datasets.load_dataset("text", data_files=str(data_path("tinyshakespeare")), split="train",
                              cache_dir=str(C.hf_cache_dir()))
joined = "".join(lines["text"])
print(f"line mode: {len(lines):,} rows, {len(joined):,} characters kept, {len(set(joined))} distinct, "
      f"{joined.count(chr(10))} newlines")
assert len(set(joined)) == len(set(text)) - 1 and "\n" not in joined

# %% [markdown]
# Tokenizing is a **batched map**: the function receives a batch of rows (a dict of lists) and returns
# new columns. Here a batch holds our one document, and the tokenizer is unit 01's `CharTokenizer`
# (ids in sorted character order). `datasets` writes the result to an Arrow file in the user cache.

# %%
char_tok = llmcourse.CharTokenizer.from_text(text)


def to_ids(batch):
    return {"ids": [char_tok.encode(t) for t in batch["text"]]}


ids_ds = docs.map(to_ids, batched=True, remove_columns=["text"])
print(ids_ds, "\ncached in", os.path.dirname(ids_ds.cache_files[0]["filename"]))

# %% [markdown]
# `llmcourse.data.corpus.char_corpus` packages the same pipeline (with a fixed fingerprint) and hands the
# ids to torch with `.with_format("torch")`, as one long stream split by position: the first 90 % of the
# characters train, the last 10 % validate. A second call reads the Arrow cache:

# %%
t0 = time.perf_counter()
corpus = C.char_corpus("tinyshakespeare")
t_cached = time.perf_counter() - t0
assert torch.equal(torch.tensor(ids_ds[0]["ids"]), torch.cat([corpus.train, corpus.val]))
print(f"train {corpus.train.numel():,} characters, validation {corpus.val.numel():,}; "
      f"loaded from the cache in {t_cached:.2f} s")
assert corpus.train.numel() == int(0.9 * len(text)) == 1_003_854
print("validation starts:", repr(corpus.tokenizer.decode(corpus.val[:80].tolist())))

# %% [markdown]
# **Tokens per step, epochs vs steps.** A step sees `B × T` tokens. Language models are trained for a
# number of **steps**, not epochs: random windows overlap and repeat, and "one pass over the data" is
# only a unit of account, `steps × B × T / len(train)`. This profile's run:

# %%
tokens_seen = STEPS * B * T
passes = tokens_seen / corpus.train.numel()
print(f"{STEPS} steps × {B} × {T} = {tokens_seen:,} tokens ≈ {passes:.2f} passes over the training split")
assert tokens_seen == STEPS * B * T and abs(passes - tokens_seen / 1_003_854) < 1e-12

# %% [markdown]
# ## 2. Batches keyed by the step
#
# `get_batch(data, B, T, generator)` draws `B` offsets with one call
# `torch.randint(0, len(data) − T, (B,), generator=generator)` and cuts the windows `data[o : o+T]`
# (inputs) and `data[o+1 : o+T+1]` (targets, shifted by one). The largest offset, `len(data) − T − 1`,
# still leaves room for the last target. A worked example on `data = 0, 1, …, 99`:

# %%
x, y = C.get_batch(torch.arange(100), 2, 4, torch.Generator().manual_seed(0))
print("x =", x.tolist(), "\ny =", y.tolist())
assert x.tolist() == [[44, 45, 46, 47], [15, 16, 17, 18]] and torch.equal(y, x + 1)

# %% [markdown]
# The training loop seeds a **fresh generator with `seed + step`** for every step. The batch of step
# 7 is then a pure function of `(seed, 7)`: whoever asks for it, in whichever process, after whatever
# happened before, gets the same windows. Compare a shuffling `DataLoader`: resuming it in the middle
# of an epoch needs its sampler's state and position, or the run silently repeats or skips data.

# %%
def batch_of_step(step, seed=cfg["seed"]):
    return C.get_batch(corpus.train, B, T, torch.Generator().manual_seed(seed + step))


first, again = batch_of_step(7), batch_of_step(7)
_ = batch_of_step(8)                      # other draws in between change nothing
assert torch.equal(first[0], again[0]) and torch.equal(first[1], batch_of_step(7)[1])
print(f"step 7, row 0 ({T} characters):", repr(corpus.tokenizer.decode(first[0][0].tolist())))

# %% [markdown]
# ## 3. The loss, perplexity, and where training starts
#
# The model predicts a distribution over the V = 65 characters at **every** position, so one batch
# gives `B × T` next-token predictions. The loss is their mean cross-entropy in nats. PyTorch's
# `F.cross_entropy` wants the classes in dimension 1, so logits `(B, T, V)` are flattened to
# `(B·T, V)` first (`lm_loss` does this).
#
# **Perplexity** `exp(loss)` is the loss in a friendlier unit: the number of equally likely choices
# that would be as surprising. A model that knows nothing predicts the uniform distribution, with
# loss `ln V` and perplexity `V`. GPT-2's initialisation (weights with standard deviation 0.02) makes
# the logits tiny, so the untrained model is almost exactly there:

# %%
torch.manual_seed(cfg["seed"])
model0 = GPT2Model(GPT2Config.preset("gpt2-char-tiny"))
xb, yb = C.get_batch(corpus.train, B, 64, torch.Generator().manual_seed(0))
with torch.no_grad():
    logits0 = model0(xb)
loss0 = lm_loss(logits0, yb).item()
print(f"logits std {logits0.std():.4f}; initial loss {loss0:.4f} vs ln 65 = {math.log(65):.4f}; "
      f"perplexity {perplexity(loss0):.1f}")
assert abs(loss0 - math.log(65)) < 0.1

# %% [markdown]
# An initial loss far above `ln V` means over-confident random logits (a bad initialisation, a missing
# scale); far below means the model can see its targets (a shifted-by-zero batch, a leaking mask).
# Checking it costs one forward pass.
#
# ### Spot the bug: perplexity from a summed loss
#
# A popular write-up reports the perplexity of an evaluation as `exp(sum of the batch losses)`.
# Evaluate our untrained model on five batches (the last one smaller) and apply that recipe. The
# property to check: a model at chance level must have a perplexity close to V = 65.

# %%
sizes = [B, B, B, B, B // 4]
batch_losses = []
with torch.no_grad():
    for i, n in enumerate(sizes):
        xe, ye = C.get_batch(corpus.val, n, 64, torch.Generator().manual_seed(100 + i))
        batch_losses.append(lm_loss(model0(xe), ye).item())     # each one a mean over its n·64 positions


def run_perplexity_buggy(batch_losses, batch_sizes):
    return math.exp(sum(batch_losses))


print(f"batch losses {[round(v, 3) for v in batch_losses]}")
print(f"exp(sum) = {run_perplexity_buggy(batch_losses, sizes):,.0f}  (a chance-level model should be near 65)")

# %%
def run_perplexity(batch_losses, batch_sizes):
    # TODO: the perplexity of all the positions together (batches of different sizes weigh differently)
    return math.exp(sum(batch_losses))


def self_check_perplexity(fn):
    want = math.exp(sum(v * n for v, n in zip(batch_losses, sizes)) / sum(sizes))
    try:
        got = fn(batch_losses, sizes)
        ok = abs(got - want) < 1e-6 * want and abs(got - 65) < 8
    except Exception as err:  # noqa: BLE001 - a self-check reports, it never raises
        got, ok = f"{type(err).__name__}", False
    print("✓ perplexity is fixed" if ok else f"✗ not yet: got {got}; a chance-level model should be near 65")
    return ok


self_check_perplexity(run_perplexity)

# %% jupyter={"source_hidden": true}
# Reference (read after trying): the exponent must be the **mean** loss per token; each batch's mean is
# weighted by its size (here all rows have the same length, so by its number of rows). A sum grows with
# the number of batches and its exponential is meaningless.
def run_perplexity_reference(batch_losses, batch_sizes):
    mean = sum(v * n for v, n in zip(batch_losses, batch_sizes)) / sum(batch_sizes)
    return math.exp(mean)


assert self_check_perplexity(run_perplexity_reference)

# %% [markdown]
# ## 4. AdamW and its parameter groups
#
# AdamW applies weight decay **decoupled** from the gradient: every step, each decayed weight is also
# multiplied by `1 − lr·weight_decay`. GPT recipes decay the tensors that mix features (the projections
# and the embedding table) and leave alone the ones that shift or rescale each feature on its own: biases
# and LayerNorm gains and shifts. `configure_optimizer` builds the two groups (which rule it uses is the
# exercise's question). GPT-2 ties its output head to the token embedding, so the two names share one
# tensor, which must appear once:

# %%
opt0 = O.configure_optimizer(model0, lr=cfg["max_lr"], weight_decay=cfg["weight_decay"])
for i, g in enumerate(opt0.param_groups):
    print(f"group {i}: {len(g['params'])} tensors, {sum(p.numel() for p in g['params']):,} parameters, "
          f"weight_decay {g['weight_decay']}")
sizes_groups = [sum(p.numel() for p in g["params"]) for g in opt0.param_groups]
names_all = [n for n, _ in model0.named_parameters(remove_duplicate=False)]
names_unique = [n for n, _ in model0.named_parameters()]
print(f"{len(names_all)} names, {len(names_unique)} distinct tensors; lm_head.weight is tok_emb.weight:",
      model0.lm_head.weight is model0.tok_emb.weight)
assert sizes_groups == [802_944, 6_912] and sum(sizes_groups) == sum(p.numel() for p in model0.parameters())
assert set(names_all) - set(names_unique) == {"lm_head.weight"}

# %% [markdown]
# What decay would do to a LayerNorm gain: with zero gradients, Adam's update is zero and only the
# decay acts. The gain starts at 1 and shrinks geometrically; the gradient has to fight that pull at
# every step, although nothing suggests the gain should be small. (A popular write-up decays
# everything.) The factor of one step is `1 − lr·wd` with **that step's** learning rate, so over a run
# the shrink is the product `∏ₛ (1 − lr(s)·wd)` along the schedule of section 5 (warm-up, cosine to a
# floor), not `(1 − max_lr·wd)^steps`. Both, and AdamW itself stepping through the schedule:

# %%
ln = model0.blocks[0].norm1.weight
decay_all = torch.optim.AdamW([ln], lr=cfg["max_lr"], weight_decay=cfg["weight_decay"])
before = ln.detach().clone()
ln.grad = torch.zeros_like(ln)
decay_all.step()
factor = float(ln.detach()[0] / before[0])
with torch.no_grad():
    ln.copy_(before)
wd = cfg["weight_decay"]
sched = [warmup_cosine_lr(s, cfg["max_lr"], cfg["min_lr"], cfg["warmup_steps"], STEPS) for s in range(STEPS)]
predicted = math.prod(1 - lr_s * wd for lr_s in sched)
for lr_s in sched:                      # AdamW through the schedule, zero gradients: only the decay acts
    for group in decay_all.param_groups:
        group["lr"] = lr_s
    ln.grad = torch.zeros_like(ln)
    decay_all.step()
measured = float(ln.detach()[0] / before[0])
with torch.no_grad():
    ln.copy_(before)
print(f"one step at max_lr: gain × {factor:.6f} (= 1 − max_lr·wd = {1 - cfg['max_lr'] * wd:.6f})")
print(f"after {STEPS} steps at a constant max_lr: × {factor ** STEPS:.4f}; along the schedule: "
      f"∏(1 − lr(s)·wd) = {predicted:.4f}, AdamW measured {measured:.4f}")
assert abs(factor - (1 - cfg["max_lr"] * wd)) < 1e-6
assert abs(measured - predicted) < 1e-4 and predicted > factor ** STEPS

# %% [markdown]
# ## 5. Warm-up, then a cosine to a floor
#
# Adam's early steps are noisy (its second-moment estimate has seen few gradients), so the learning
# rate **warms up** over `warmup_steps`, and its first step already moves (a step with lr 0 is wasted).
# Then it decays smoothly from `max_lr` to a floor `min_lr`, reached at `total_steps`, and stays there.
# Continuous at the end of warm-up, never increasing afterwards (the exact shape is the exercise's question;
# the explorer below draws it):

# %%
for s in (0, 9, 10, 55, 100, 150):
    print(f"step {s:3d}: lr {warmup_cosine_lr(s, 1e-3, 1e-4, 10, 100):.2e}")
lrs = [warmup_cosine_lr(s, cfg["max_lr"], cfg["min_lr"], cfg["warmup_steps"], STEPS) for s in range(STEPS + 50)]
w = cfg["warmup_steps"]
assert lrs[w - 1] == lrs[w] == cfg["max_lr"] and all(a >= b for a, b in zip(lrs[w:], lrs[w + 1:]))
assert lrs[STEPS:] == [cfg["min_lr"]] * 50

# %% tags=["nbval-ignore-output"]
viz.show_schedule_explorer(cfg["max_lr"], cfg["min_lr"], cfg["warmup_steps"], STEPS)

# %% [markdown]
# ## 6. Clipping by the global norm
#
# One unlucky batch can produce a huge gradient and undo hours of training. Clipping caps the **length**
# of the update: treat all gradients as one long vector `g`; if `‖g‖ > max_norm`, multiply every
# gradient by `max_norm / ‖g‖`. The direction is unchanged. Clipping each tensor separately would cap
# each piece on its own and turn the update: compare the two on a real gradient.

# %%
model0.zero_grad()
lm_loss(model0(xb), yb).backward()
raw = [p.grad.detach().clone() for p in model0.parameters()]
max_norm = 0.1
pre = O.clip_grad_norm(model0.parameters(), max_norm)             # the library's global clipping, in place
global_clipped = [p.grad.detach().clone() for p in model0.parameters()]
per_tensor = [g * min(1.0, max_norm / (float(g.norm()) + 1e-6)) for g in raw]   # the mistake


def flat(ts):
    return torch.cat([t.flatten() for t in ts])


def cosine(a, b):
    a, b = flat(a).double(), flat(b).double()
    return float(a @ b / (a.norm() * b.norm()))


cos_global, cos_tensor = cosine(raw, global_clipped), cosine(raw, per_tensor)
print(f"norm before clipping {pre:.3f}; after: global {flat(global_clipped).norm():.4f}, "
      f"per tensor {flat(per_tensor).norm():.4f}")
print(f"cosine with the raw gradient: global {cos_global:.6f}, per tensor {cos_tensor:.4f}")
assert abs(cos_global - 1) < 1e-9 and cos_tensor < 0.99
model0.zero_grad()

# %% [markdown]
# The norm **before** clipping is the number worth logging: if it sits above `max_norm` most of the
# time the clip is really a learning-rate cut, and spikes in it announce instabilities. The dashboard
# below plots it with the clip line.
#
# ## 7. The loop, and the mistake that makes gradients pile up
#
# One step of `train_steps`: set the step's learning rate on every group, zero the gradients, forward,
# loss, backward, clip, optimizer step. The order matters twice. Clipping after `optimizer.step()` clips
# gradients that have already been used (the step it was meant to tame is taken unclipped). And
# `loss.backward()` **adds** into `.grad`; nothing resets it but `zero_grad()`.
#
# ### Spot the bug: no `zero_grad`
#
# Run three backward passes over the same batch, as a loop without `zero_grad` would, and watch the
# gradient norm. The property: the same batch at the same weights must give the same gradient.

# %%
def grad_norms_buggy(model, n=3):
    norms = []
    for _ in range(n):
        lm_loss(model(xb), yb).backward()
        norms.append(math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters())))
    return norms


print("gradient norms:", [round(v, 4) for v in grad_norms_buggy(model0)])
model0.zero_grad()

# %%
def grad_norms(model, n=3):
    norms = []
    for _ in range(n):
        # TODO: make every pass start from empty gradients
        lm_loss(model(xb), yb).backward()
        norms.append(math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters())))
    return norms


def self_check_zero_grad(fn):
    try:
        norms = fn(model0)
        ok = max(norms) - min(norms) < 1e-4 * max(norms)
    except Exception as err:  # noqa: BLE001 - a self-check reports, it never raises
        norms, ok = f"{type(err).__name__}", False
    model0.zero_grad()
    print("✓ gradients no longer pile up" if ok else f"✗ not yet: the norms {norms} grow")
    return ok


self_check_zero_grad(grad_norms)

# %% jupyter={"source_hidden": true}
# Reference (read after trying): clear the gradients before every backward pass. In a training loop,
# `optimizer.zero_grad()` does the same for the parameters the optimizer holds. (Accumulating on purpose
# over several micro-batches is a technique, shown below, but then each micro-batch's loss is weighted and
# `zero_grad` comes after the optimizer step.)
def grad_norms_reference(model, n=3):
    norms = []
    while len(norms) < n:
        model.zero_grad()
        lm_loss(model(xb), yb).backward()
        norms.append(math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters())))
    return norms


assert self_check_zero_grad(grad_norms_reference)

# %% [markdown]
# **Validation.** `estimate_loss` averages the loss of a fixed set of batches in `eval()` mode without
# gradients and then restores the model's previous mode: the same batches every time make successive
# estimates comparable, and forgetting to switch back would train the rest of the run without dropout.
#
# ### Spot the bug: gradient accumulation that does not add up
#
# When a batch does not fit in memory, one runs it as several **micro-batches** and lets the gradients
# accumulate before a single optimizer step. Done right, the accumulated gradient *equals* the gradient of
# the whole batch's mean loss, so the step is the same. The helper below reports the loss and the gradient
# of a batch of 8 windows computed as micro-batches of 3, 3 and 2. Its loss is right; compare its gradient
# with the one-batch gradient. One line is wrong; nothing marks it.

# %%
def accumulated_grads_buggy(model, x, y, micro_sizes):
    """Loss and gradients of the mean next-token loss over (x, y), computed micro-batch by micro-batch."""
    if sum(micro_sizes) != len(x):
        raise ValueError(f"micro-batch sizes {micro_sizes} do not add up to the batch of {len(x)}")
    model.zero_grad(set_to_none=True)
    total_loss, start = 0.0, 0
    for size in micro_sizes:
        xb, yb = x[start:start + size], y[start:start + size]
        loss = lm_loss(model(xb), yb)                 # the mean over this micro-batch's positions
        loss.backward()                               # gradients add up in .grad across micro-batches
        total_loss += loss.item() * size / len(x)     # its share of the whole batch's mean
        start += size
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    norm = math.sqrt(sum(float(g.pow(2).sum()) for g in grads.values()))
    model.zero_grad(set_to_none=True)
    return {"loss": total_loss, "grads": grads, "norm": norm}


acc_x, acc_y = C.get_batch(corpus.train, 8, 64, torch.Generator().manual_seed(42))
model0.eval()                                          # no dropout: both routes see the same function
model0.zero_grad(set_to_none=True)
big_loss = lm_loss(model0(acc_x), acc_y)
big_loss.backward()
big_grads = {n: p.grad.detach().clone() for n, p in model0.named_parameters() if p.grad is not None}
big_norm = math.sqrt(sum(float(g.pow(2).sum()) for g in big_grads.values()))
model0.zero_grad(set_to_none=True)
acc = accumulated_grads_buggy(model0, acc_x, acc_y, [3, 3, 2])
print(f"one batch: loss {big_loss.item():.5f}, gradient norm {big_norm:.5f}")
print(f"micro-batches 3+3+2: loss {acc['loss']:.5f}, gradient norm {acc['norm']:.5f} "
      f"({acc['norm'] / big_norm:.2f}× the one-batch norm)")

# %% [markdown]
# The losses agree; the gradients do not. Fix the copy below so that the gradients equal the one-batch
# gradients for **any** split (the self-check also tries 4 + 4 and 5 + 1 + 2), and run the self-check.

# %%
def accumulated_grads(model, x, y, micro_sizes):
    # TODO: one line of this copy of accumulated_grads_buggy is wrong; fix it
    if sum(micro_sizes) != len(x):
        raise ValueError(f"micro-batch sizes {micro_sizes} do not add up to the batch of {len(x)}")
    model.zero_grad(set_to_none=True)
    total_loss, start = 0.0, 0
    for size in micro_sizes:
        xb, yb = x[start:start + size], y[start:start + size]
        loss = lm_loss(model(xb), yb)
        loss.backward()
        total_loss += loss.item() * size / len(x)
        start += size
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    norm = math.sqrt(sum(float(g.pow(2).sum()) for g in grads.values()))
    model.zero_grad(set_to_none=True)
    return {"loss": total_loss, "grads": grads, "norm": norm}


def self_check_accumulation(fn):
    try:
        ok = True
        for split in ([3, 3, 2], [4, 4], [5, 1, 2]):
            out = fn(model0, acc_x, acc_y, split)
            ok = ok and abs(out["loss"] - big_loss.item()) < 1e-5 and all(
                torch.allclose(out["grads"][n], g, atol=1e-6, rtol=1e-4) for n, g in big_grads.items())
    except Exception as err:  # noqa: BLE001 - a self-check reports, it never raises
        print(f"✗ not yet: the helper raised {type(err).__name__}: {err}")
        return False
    print("✓ accumulated gradients equal the one-batch gradients for every split" if ok else
          "✗ not yet: the accumulated gradients differ from the one-batch gradients (how much should each "
          "micro-batch's loss count?)")
    return ok


self_check_accumulation(accumulated_grads)

# %% jupyter={"source_hidden": true}
# Reference (read after trying): each micro-batch's loss is a mean over its own positions, so backward on
# it as it is counts every micro-batch as much as the whole batch: the gradients of 3 micro-batches add up
# to about 3× the right one. Weight each loss by its share of the batch (size / len(x)) before backward,
# exactly as the reported loss already does; with equal sizes that is dividing by the number of
# micro-batches. The fixed helper, derived from the buggy one by that change only:
import inspect  # noqa: E402

exec(inspect.getsource(accumulated_grads_buggy)  # noqa: S102 - defines accumulated_grads_reference
     .replace("        loss.backward()  ", "        (loss * size / len(x)).backward()  ")
     .replace("def accumulated_grads_buggy", "def accumulated_grads_reference"))
assert self_check_accumulation(accumulated_grads_reference)  # noqa: F821

# %% [markdown]
# ## 8. Checkpoints that resume exactly
#
# A checkpoint holds plain data only: the model's and the optimizer's state dicts, the step, the run's
# config and torch's RNG state. Adam's moment estimates live in the optimizer state; the RNG state
# drives dropout; the batches need nothing, being keyed by the step. The test of a checkpoint is
# **exact resumption**: with dropout on, `2k` steps in one go must equal `k` steps, save, a fresh model
# and optimizer (even a fresh process), load, and `k` more.

# %%
small_cfg = GPT2Config(**{**GPT2Config.preset("gpt2-char-tiny").to_dict(), "n_layers": 2, "dropout": 0.1})


def lr_small(s):
    return warmup_cosine_lr(s, 3e-3, 3e-4, 2, 12)


def fresh_run(seed):
    torch.manual_seed(seed)
    m = GPT2Model(small_cfg)
    return m, O.configure_optimizer(m, 3e-3)


k = 4
m, opt = fresh_run(0)
torch.manual_seed(1)
uninterrupted = P.train_steps(m, opt, corpus.train, 2 * k, 0, 8, 32, lr_small, 1.0, cfg["seed"])
m, opt = fresh_run(0)
torch.manual_seed(1)
part1 = P.train_steps(m, opt, corpus.train, k, 0, 8, 32, lr_small, 1.0, cfg["seed"])
ckpt_dir = tempfile.mkdtemp()
path = os.path.join(ckpt_dir, "step4.pt")
K.save_checkpoint(path, m, opt, k, {"model": small_cfg.to_dict(), "lr": 3e-3})
torch.manual_seed(12345)                  # a different process would have its generator anywhere
m2, opt2 = fresh_run(99)                  # different initial weights, overwritten by the checkpoint
step = K.load_checkpoint(path, m2, opt2)
part2 = P.train_steps(m2, opt2, corpus.train, k, step, 8, 32, lr_small, 1.0, cfg["seed"])
for s, (a, b) in enumerate(zip(uninterrupted, part1 + part2)):
    print(f"step {s}: {a:.6f} {b:.6f}{'   <- resumed' if s == k else ''}")
assert max(abs(a - b) for a, b in zip(uninterrupted, part1 + part2)) < 1e-6

# %% [markdown]
# What the file holds, and what each part costs on disk (Adam keeps two numbers per parameter):

# %%
raw_ckpt = torch.load(path, map_location="cpu", weights_only=True)


def nbytes(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.tell()


for key in K.CHECKPOINT_KEYS:
    print(f"{key:10s} {nbytes(raw_ckpt[key]):>10,} bytes")
assert 1.8 < nbytes(raw_ckpt["optimizer"]) / nbytes(raw_ckpt["model"]) < 2.2

# %% [markdown]
# ### Spot the bug: saving the whole model object
#
# `torch.save(model, path)` pickles the module object, which refers to its class by import path. Since
# PyTorch 2.6, `torch.load` defaults to `weights_only=True` and refuses such files (loading them would
# run arbitrary code), and they break anyway as soon as the class moves. Run it:

# %%
whole = os.path.join(ckpt_dir, "whole_model.pt")
torch.save(m2, whole)
try:
    torch.load(whole)
    print("loaded (unexpected)")
except Exception as err:  # noqa: BLE001 - the point of the demo
    print(f"{type(err).__name__}: {str(err).splitlines()[0][:160]}")

# %%
def save_for_sharing(model, path):
    # TODO: save something that torch.load(path, weights_only=True) accepts and that rebuilds the model
    torch.save(model, path)


def self_check_sharing(save_fn):
    p = os.path.join(ckpt_dir, "shared.pt")
    why = "the rebuilt model differs"
    try:
        save_fn(m2, p)
        saved = torch.load(p, map_location="cpu", weights_only=True)
        rebuilt = GPT2Model(GPT2Config(**saved["config"]))
        rebuilt.load_state_dict(saved["model"])
        probe = xb[:2, :16]
        with torch.no_grad():
            ok = torch.allclose(rebuilt.eval()(probe), m2.eval()(probe), atol=1e-6)
    except Exception as err:  # noqa: BLE001 - reported below
        ok, why = False, f"{type(err).__name__}: {str(err).splitlines()[0][:100]}"
    print("✓ the file loads with weights_only=True and rebuilds the model" if ok else
          f"✗ not yet ({why}); save a dict with 'model' (the state dict) and 'config' (a plain dict)")
    return ok


self_check_sharing(save_for_sharing)

# %% jupyter={"source_hidden": true}
# Reference (read after trying): save plain data, never the module. State dicts (tensors) and plain data
# (numbers, strings, lists, dicts) load with `weights_only=True`; the reader rebuilds the model from the
# config. That is what the exercise's `save_checkpoint` writes (with the optimizer, the step and the RNG
# state too), so the check runs on the library's version instead of showing it; the course's shipped
# character model is stored the same way.
assert self_check_sharing(lambda model, path: K.save_checkpoint(
    path, model, torch.optim.SGD(model.parameters(), lr=0.0), 0, model.cfg.to_dict()))

# %% [markdown]
# ## 9. The run
#
# Now the real thing, with this profile's settings: `gpt2-char-tiny` with a context of `T` characters,
# AdamW with the two groups, warm-up and cosine, clipping at `max_norm`, an evaluation on fixed
# training and validation batches every `eval_every` steps, and a text sample of `sample_chars` characters
# each time.
# Weight snapshots at 0, 25, 50 and 100 % of the run feed the checkpoint sampler further down. With
# live widgets (the `laptop` profile) the dashboard redraws while the model trains.

# %%
print(f"steps {STEPS}, batch {B}, context {T}, lr {cfg['max_lr']} -> {cfg['min_lr']} (warm-up "
      f"{cfg['warmup_steps']}), weight decay {cfg['weight_decay']}, clip {cfg['max_norm']}")
run_cfg = GPT2Config(**{**GPT2Config.preset("gpt2-char-tiny").to_dict(), "context_length": T})
torch.manual_seed(cfg["seed"])
model = GPT2Model(run_cfg)
print(f"{sum(p.numel() for p in model.parameters()):,} parameters")
snapshots_at = sorted({0, STEPS // 4, STEPS // 2, STEPS})


def sample_now(m):
    return P.sample_text(m, corpus.tokenizer, "ROMEO:", cfg["sample_chars"], temperature=0.8, seed=0)


dashboard, redraw = viz.make_training_dashboard(STEPS, corpus.vocab_size)
if dashboard is not None:
    display(dashboard)

# %% tags=["nbval-ignore-output"]
hist = P.pretrain(model, corpus.train, corpus.val, steps=STEPS, batch_size=B, context_length=T,
                  max_lr=cfg["max_lr"], min_lr=cfg["min_lr"], warmup_steps=cfg["warmup_steps"],
                  weight_decay=cfg["weight_decay"], max_norm=cfg["max_norm"], seed=cfg["seed"],
                  eval_every=cfg["eval_every"], eval_batches=cfg["eval_batches"], sample_fn=sample_now,
                  snapshot_steps=snapshots_at, callback=redraw, callback_every=cfg["dashboard_every"],
                  device=cfg["device"])
print(f"{hist['seconds']:.0f} s of training, {hist['ms_per_step']:.0f} ms/step")

# %% tags=["nbval-ignore-output"]
viz.show_training_dashboard(hist, corpus.vocab_size)

# %% [markdown]
# The numbers of the run: the final validation loss and perplexity next to the range this profile's
# run normally lands in (the range is for orientation, not a grade), and the speed.

# %%
final_val, final_train = hist["val_loss"][-1], hist["train_loss_eval"][-1]
lo, hi = cfg["val_loss_range"]
summary = viz.dashboard_summary(hist)
print(f"initial validation loss {hist['val_loss'][0]:.3f} (ln 65 = {math.log(65):.3f})")
print(f"final validation loss {final_val:.3f}, perplexity {perplexity(final_val):.2f}; "
      f"usual range for the '{cfg['name']}' profile: {lo}–{hi}")
print(f"training loss on the same number of fixed batches {final_train:.3f}; gap {final_val - final_train:+.3f}")
print(f"{tokens_seen:,} tokens seen ({passes:.2f} passes); median {summary['tokens_per_s']:,.0f} tokens/s; "
      f"clipped on {100 * summary['clipped_fraction']:.0f} % of the steps")
assert hist["val_loss"][-1] < hist["val_loss"][0] - 1.0

# %% [markdown]
# **Is it learning or memorising?** The validation loss is measured on text the model never trains on.
# As long as it falls with the training loss, the model is learning patterns that carry over; a gap
# that keeps widening while the validation loss stalls or rises is memorisation. A write-up that shows
# only a steadily falling training loss has not looked. The last evaluations of this run:

# %%
gaps = [v - t_ for v, t_ in zip(hist["val_loss"], hist["train_loss_eval"])]
for s, v, g in list(zip(hist["eval_step"], hist["val_loss"], gaps))[-3:]:
    print(f"step {s:5d}: validation {v:.3f}, validation − training {g:+.3f}")
still_falling = hist["val_loss"][-1] < hist["val_loss"][-2]
print("validation loss still falling at the end:", still_falling,
      "| gap widening over the last two evaluations:", gaps[-1] > gaps[-2] + 0.01)

# %% [markdown]
# Judge by the trend, not by one number: the two streams are different text (the validation part is
# the end of the file), so a constant gap says little. While the validation loss still falls, more
# steps help; once it flattens while the training loss keeps falling, more steps mostly memorise.
#
# **Speed.** On a reference 2-core laptop CPU one step of this model at batch 32 and context 64 takes
# about 117 ms. Measured here, on this machine, right now:

# %%
timing_model = GPT2Model(GPT2Config.preset("gpt2-char-tiny"))
timing_opt = O.configure_optimizer(timing_model, 1e-3)
P.train_steps(timing_model, timing_opt, corpus.train, 2, 0, 32, 64, lambda s: 1e-3, 1.0, 0)   # warm-up
t0 = time.perf_counter()
P.train_steps(timing_model, timing_opt, corpus.train, 10, 2, 32, 64, lambda s: 1e-3, 1.0, 0)
ms_step = 100 * (time.perf_counter() - t0)
print(f"{ms_step:.0f} ms/step at B=32, T=64 (reference: about 117 ms); {32 * 64 / ms_step * 1000:,.0f} tokens/s")

# %% [markdown]
# **How busy were the cores?** A training step costs about `6 N` floating-point operations per token for
# the `N` weights that multiply activations (2 for the forward product, 4 for the two backward ones), plus
# attention's own products, `QKᵀ` and `A·V`: `4·T·D` per token and layer forward, three times that with
# backward, so `12·L·T·D` (the position table is looked up, not multiplied, and the head is the tied
# token table, counted once). torch's `FlopCounterMode` counts the operations it has formulas for.
# Against the run's tokens per second, that is the achieved FLOP/s; the machine's peak is measured with a
# large matrix product, as fast as the matrix library gets here.

# %%
n_mul = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and n != "pos_emb.weight")
L_, D_ = run_cfg.n_layers, run_cfg.d_model
flops_per_token = 6 * n_mul + 12 * L_ * T * D_
xf, yf = C.get_batch(corpus.train, B, T, torch.Generator().manual_seed(0))
with FlopCounterMode(display=False) as counter:
    lm_loss(model(xf), yf).backward()
model.zero_grad(set_to_none=True)
counted = counter.get_total_flops() / (B * T)
print(f"per token: 6N = {6 * n_mul:,} + attention 12·L·T·D = {12 * L_ * T * D_:,} = {flops_per_token:,}")
print(f"FlopCounterMode counts {counted:,.0f} per token"
      + (" (= 6N: it has no formula for the CPU attention kernel)" if abs(counted - 6 * n_mul) < 1 else ""))
n_peak = cfg["peak_matmul_n"]
a_, b_ = torch.randn(n_peak, n_peak), torch.randn(n_peak, n_peak)
peak_times = []
for _ in range(6):
    t0 = time.perf_counter()
    _ = a_ @ b_
    peak_times.append(time.perf_counter() - t0)
peak = 2 * n_peak ** 3 / min(peak_times[1:])
achieved = flops_per_token * summary["tokens_per_s"]
print(f"the run: {summary['tokens_per_s']:,.0f} tokens/s × {flops_per_token:,} FLOPs = {achieved / 1e9:.1f} GFLOP/s; "
      f"measured matmul peak ({n_peak}×{n_peak}, {torch.get_num_threads()} threads) {peak / 1e9:.1f} GFLOP/s: "
      f"{achieved / peak:.0%} of it")
assert 6 * n_mul <= counted * 1.001 and counted <= flops_per_token * 1.001

# %% [markdown]
# **Samples over time.** The same prompt, `ROMEO:`, sampled at temperature 0.8 at every evaluation:

# %%
for step, sample in hist["samples"]:
    print(f"--- after {step} steps (validation loss {dict(zip(hist['eval_step'], hist['val_loss']))[step]:.3f})")
    print("ROMEO:" + sample)

# %% [markdown]
# **The checkpoint sampler.** The snapshots taken at 0, 25, 50 and 100 % of the run (the loop evaluated
# and sampled each of them), now also decoded greedily. Greedy decoding from a weak model loops on the
# most likely few characters (unit 09).

# %%
val_at = dict(zip(hist["eval_step"], hist["val_loss"]))
rows = viz.checkpoint_samples(hist["snapshots"], lambda: GPT2Model(run_cfg), corpus.tokenizer, "ROMEO:",
                              cfg["sample_chars"], val_losses=val_at, sampled=dict(hist["samples"]))
for r in rows:
    print(f"after {r['step']:5d} steps: validation loss {r['val_loss']:.3f}")
assert [r["step"] for r in rows] == snapshots_at and rows[-1]["val_loss"] < rows[0]["val_loss"]

# %% tags=["nbval-ignore-output"]
viz.show_checkpoint_sampler(rows)

# %% [markdown]
# ## 10. What a minute buys: tokens per step against steps per minute
#
# Your budget is minutes, not steps. A bigger batch gives a less noisy gradient per step but costs more per
# step; a smaller one takes more, noisier steps in the same time. Which wins depends on how far the run
# gets: early on, many rough steps beat a few precise ones; later, the noise is what stops progress.
#
# The experiment: a few batch shapes (`ttq_shapes`, rows × context), each trained from the same initial
# weights for the **same wall-clock budget** (`ttq_seconds`) with the schedule ending when its budget ends.
# First the milliseconds per step, measured with the shapes taking turns step by step so that a busy moment
# of the machine falls on all of them; then each run's number of steps is the budget divided by its time
# per step, and its validation loss (the same windows of 64 characters for every shape) is drawn against
# `step × ms/step`.

# %%
shapes = [tuple(sh) for sh in cfg["ttq_shapes"]]
budget_s = cfg["ttq_seconds"]


def fresh_model_and_optimizer(context):
    torch.manual_seed(cfg["seed"])
    m = GPT2Model(GPT2Config(**{**GPT2Config.preset("gpt2-char-tiny").to_dict(), "context_length": context}))
    return m, O.configure_optimizer(m, cfg["max_lr"], cfg["weight_decay"])


timing_runs = {sh: fresh_model_and_optimizer(sh[1]) for sh in shapes}
step_s = {sh: [] for sh in shapes}
for rnd in range(5):
    for sh in shapes:                                    # the shapes take turns, step by step
        m_, o_ = timing_runs[sh]
        t0 = time.perf_counter()
        P.train_steps(m_, o_, corpus.train, 1, rnd, sh[0], sh[1], lambda s: 1e-4, 1.0, 0)
        step_s[sh].append(time.perf_counter() - t0)
ms_of = {sh: 1000 * statistics.median(v[1:]) for sh, v in step_s.items()}   # the first step warms up

ttq = {}
for sh in shapes:
    n = max(cfg["ttq_evals"] * 2, int(budget_s * 1000 / ms_of[sh]))
    m_, o_ = fresh_model_and_optimizer(sh[1])
    lr_fn = lambda s, n=n: warmup_cosine_lr(s, cfg["max_lr"], cfg["min_lr"], max(1, n // 20), n)  # noqa: E731
    marks = sorted({round(n * i / cfg["ttq_evals"]) for i in range(cfg["ttq_evals"] + 1)})
    curve = []
    for a, b in zip([0] + marks[:-1], marks):
        P.train_steps(m_, o_, corpus.train, b - a, a, sh[0], sh[1], lr_fn, cfg["max_norm"], cfg["seed"])
        curve.append((b * ms_of[sh] / 1000, P.estimate_loss(m_, corpus.val, 16, 64, 4, P.EVAL_SEED)))
    ttq[sh] = {"steps": n, "curve": curve}

print(f"budget {budget_s} s per shape on {torch.get_num_threads()} threads")
print(f"{'rows × context':>15} {'tokens/step':>11} {'ms/step':>8} {'steps/min':>9} {'tokens/s':>9} {'steps':>6} "
      f"{'val loss':>8}")
for sh in shapes:
    print(f"{sh[0]:>8} × {sh[1]:<4} {sh[0] * sh[1]:>11,} {ms_of[sh]:>8.1f} {60_000 / ms_of[sh]:>9,.0f} "
          f"{sh[0] * sh[1] * 1000 / ms_of[sh]:>9,.0f} {ttq[sh]['steps']:>6} {ttq[sh]['curve'][-1][1]:>8.3f}")
best_shape = min(shapes, key=lambda sh: ttq[sh]["curve"][-1][1])
tok_s = [sh[0] * sh[1] / ms_of[sh] for sh in shapes]
print(f"tokens per second {'rise' if tok_s == sorted(tok_s) else 'do not simply rise'} with the batch here; "
      f"one step of the largest batch costs {ms_of[shapes[-1]] / ms_of[shapes[0]]:.1f}× the smallest's for "
      f"{shapes[-1][0] * shapes[-1][1] // (shapes[0][0] * shapes[0][1])}× its tokens")
print(f"lowest validation loss after {budget_s} s: {best_shape[0]} × {best_shape[1]}")
assert all(ttq[sh]["curve"][-1][1] < ttq[sh]["curve"][0][1] for sh in shapes)

# %% tags=["nbval-ignore-output"]
fig, ax = plt.subplots(figsize=(7, 3.6))
for sh in shapes:
    ax.plot(*zip(*ttq[sh]["curve"]), marker="o", label=f"{sh[0]} × {sh[1]} ({sh[0] * sh[1]:,} tokens/step)")
ax.set_xlabel("seconds of training (step × measured ms/step)")
ax.set_ylabel("validation loss")
ax.legend()
plt.show()

# %% [markdown]
# Read the table from left to right: tokens per step grow with the batch, and the time per step grows
# too, but usually more slowly (a tiny batch leaves the cores waiting on fixed overheads; the line above
# says how it went here), so tokens per second favour big batches while steps per minute favour small
# ones. With a short budget the run with the most steps tends to get furthest; with a long one, the one
# that turns the most tokens into each step. Timings move
# with the machine and its load; the curves against the *step* do not (the batches are seeded), which is
# why the comparison composes each run's step curve with its measured time per step.
#
# The laptop profile's run in section 9 is chosen by the same measurement, made with longer budgets:
# its batch shape, learning rate and warm-up fit a run of a few minutes, and its cosine ends where the
# budget ends. The course compares it with the settings nanoGPT publishes for the same model size on a CPU,
# in the same two parts: each recipe's validation loss against the step, computed once and stored with the
# course in `docs/time-to-quality/` (seeded, so any machine computes the same curve, up to float rounding),
# and each recipe's milliseconds per step, which only an idle machine can measure
# (`python -m coursetools.bench.time_to_quality speed`; its docstring gives the whole procedure). The next
# cell reads what is stored: the curves, and, once a machine's speed is stored too, the loss each recipe
# stands at after each budget of minutes it lists. A budget whose runs are not stored yet is printed as such.

# %%
import json  # noqa: E402

from coursetools.bench.time_to_quality import report_rows  # noqa: E402
from llmcourse.manifest import course_root  # noqa: E402

ttq_dir = course_root() / "docs" / "time-to-quality"   # written by python -m coursetools.bench.time_to_quality
ttq_curves, ttq_speed = ({"runs": {}}, None)
if (ttq_dir / "curves.json").exists():
    ttq_curves = json.loads((ttq_dir / "curves.json").read_text(encoding="utf-8"))
if (ttq_dir / "speed.json").exists():
    ttq_speed = json.loads((ttq_dir / "speed.json").read_text(encoding="utf-8"))
for key, run in ttq_curves["runs"].items():
    state = "complete" if run["complete"] else f"stopped at step {run['step'][-1]:,}"
    print(f"{key:>12}: a {run['steps']:,}-step run ({state}), batch {run['settings']['batch_size']} × "
          f"{run['settings']['context_length']}; validation loss {run['val_loss'][0]:.3f} at step 0, "
          f"{run['val_loss'][-1]:.3f} at step {run['step'][-1]:,}")
if ttq_speed is None:
    print("ms/step of the two recipes: not stored yet (an idle machine measures them), so no budget of minutes "
          "maps to steps yet: no recipe is said to be ahead")
else:
    print(f"ms/step on {ttq_speed['machine']} ({ttq_speed['threads']} threads): {ttq_speed['ms_per_step']}")
    for row in report_rows(ttq_curves, ttq_speed, [1, 2, 3, 5, 10]):   # budgets in minutes
        if row["ahead"] is None:
            print(f"{row['minutes']:>3} min: not computed yet ({'; '.join(row['missing'])})")
        else:
            print(f"{row['minutes']:>3} min: nanoGPT {row['nanoGPT']:.3f} after {row['nanoGPT_steps']:,} steps, the "
                  f"course {row['course']:.3f} after {row['course_run']:,} steps: {row['ahead']} ahead")

# %% tags=["nbval-ignore-output"]
if ttq_curves["runs"]:
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for key, run in ttq_curves["runs"].items():
        ax.plot(run["step"], run["val_loss"], marker=".", label=key)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("validation loss")
    ax.legend()
    plt.show()

# %% [markdown]
# ### bfloat16 autocast on the CPU
#
# Under `torch.autocast("cpu", dtype=torch.bfloat16)` the matrix products of the forward pass (linear
# layers, attention's products) run in bfloat16: float32's 8-bit exponent, so the same range and no loss
# scaling, but 8 significant bits instead of 24. What follows a product keeps its dtype: on the CPU, softmax,
# log-softmax and layer norm of a bfloat16 input return bfloat16 (the cell below prints them); the **loss** is
# upcast, cross-entropy being on autocast's float32 list, and the weights, their gradients and AdamW's moments
# stay float32: autocast changes the dtype of each product's *inputs*, not of the model. The backward products follow the
# forward's dtypes. Whether that is faster depends on the processor: with bfloat16 matrix instructions
# (AMX, AVX-512 BF16) it can be; without them every product pays for conversions. Measured, with the two
# runs taking turns step by step from the same weights and the same batches:

# %%
with torch.autocast("cpu", dtype=torch.bfloat16):
    h_amp = torch.randn(4, 8) @ torch.randn(8, 8)
    amp_dtypes = {"matmul": h_amp.dtype, "softmax": h_amp.softmax(-1).dtype,
                  "log_softmax": torch.log_softmax(h_amp, -1).dtype,
                  "layer_norm": torch.nn.functional.layer_norm(h_amp, (8,)).dtype,
                  "cross_entropy (the loss)": torch.nn.functional.cross_entropy(h_amp, torch.zeros(4, dtype=torch.long)).dtype}
print("under CPU bfloat16 autocast:", {k: str(v).removeprefix("torch.") for k, v in amp_dtypes.items()})
assert amp_dtypes["matmul"] == torch.bfloat16 and amp_dtypes["cross_entropy (the loss)"] == torch.float32

# %%
amp_steps, amp_shape = cfg["amp_steps"], shapes[len(shapes) // 2]
amp = {name: fresh_model_and_optimizer(amp_shape[1]) for name in ("float32", "bfloat16")}
amp_loss = {name: [] for name in amp}
amp_s = {name: [] for name in amp}
amp_lr = lambda s: warmup_cosine_lr(s, cfg["max_lr"], cfg["min_lr"], max(1, amp_steps // 10), amp_steps)  # noqa: E731
for s in range(amp_steps):
    for name in (list(amp) if s % 2 == 0 else list(amp)[::-1]):
        m_, o_ = amp[name]
        t0 = time.perf_counter()
        amp_loss[name] += P.train_steps(m_, o_, corpus.train, 1, s, amp_shape[0], amp_shape[1], amp_lr,
                                        cfg["max_norm"], cfg["seed"],
                                        autocast_dtype=torch.bfloat16 if name == "bfloat16" else None)
        amp_s[name].append(time.perf_counter() - t0)
amp_ms = {name: 1000 * statistics.median(v[1:]) for name, v in amp_s.items()}
amp_val = {name: P.estimate_loss(m_, corpus.val, 16, 64, 4, P.EVAL_SEED) for name, (m_, _) in amp.items()}
gaps_amp = [abs(a - b) for a, b in zip(amp_loss["float32"], amp_loss["bfloat16"])]
print(f"CPU capability seen by torch: {torch.backends.cpu.get_cpu_capability()}; batch {amp_shape[0]} × {amp_shape[1]}")
for name in amp:
    print(f"{name:>9}: {amp_ms[name]:6.1f} ms/step, training loss {amp_loss[name][0]:.3f} -> {amp_loss[name][-1]:.3f}, "
          f"validation {amp_val[name]:.3f}; weights stay {next(amp[name][0].parameters()).dtype}")
speedup = amp_ms["float32"] / amp_ms["bfloat16"]
print(f"bfloat16 autocast is {speedup:.2f}× as fast as float32 here ({'faster' if speedup > 1 else 'slower'}); "
      f"largest per-step loss difference {max(gaps_amp):.4f}")
assert all(next(m_.parameters()).dtype == torch.float32 for m_, _ in amp.values())

# %% tags=["nbval-ignore-output"]
fig, ax = plt.subplots(figsize=(7, 3.2))
for name in amp:
    ax.plot(range(1, amp_steps + 1), amp_loss[name], label=f"{name} ({amp_ms[name]:.0f} ms/step)", alpha=0.8)
ax.set_xlabel("step")
ax.set_ylabel("training loss")
ax.legend()
plt.show()

# %% [markdown]
# Compare the two curves and the largest per-step difference printed above with how much the loss
# falls over the run: autocast changes the rounding of every product, so the runs drift apart a little,
# step by step; the two validation losses say whether one of them ended worse. Whether it pays is the speed line, and that is
# this processor's answer, not a general one.

# %% [markdown]
# ## The course's trained model
#
# Units 09 and later use `assets/gpt_char_tiny.pt`: the same model and loop with a longer context and a
# longer run (its recipe is printed below), run by `python -m llmcourse.train.char_model`. The file holds the weights, the config and the recipe (plain
# data, no optimizer state), so the loader builds the model from the stored config; it also records how
# long the run took on the machine that trained it. Both are read from the file, not typed here:

# %%
char_model, char_tok = load_gpt_char_tiny()
info = char_model.checkpoint_info
print({k: info["recipe"][k] for k in ("context_length", "steps", "batch_size", "max_lr", "min_lr")})
if "seconds" in info:
    print(f"recorded training time: {info['seconds']:.0f} s = {info['seconds'] / 60:.1f} min "
          f"({1000 * info['seconds'] / info['recipe']['steps']:.0f} ms per step, evaluations included)")
shipped_val = P.estimate_loss(char_model, corpus.val, 32, char_model.cfg.context_length, 20, P.EVAL_SEED)
print(f"validation loss {shipped_val:.3f} (perplexity {perplexity(shipped_val):.2f}); recorded at training time "
      f"{info['val_loss']:.3f}; this notebook's run: {final_val:.3f}")
print("ROMEO:" + P.sample_text(char_model, char_tok, "ROMEO:", cfg["sample_chars"], temperature=0.8, seed=1))
assert char_tok.chars == corpus.tokenizer.chars

# %% [markdown]
# ## Summary
#
# * Corpora go through `datasets`: one document row (`sample_by="document"` keeps the newlines), a
#   batched `.map` to token ids, an Arrow cache, then one torch stream split 90 / 10 by position.
# * A batch keyed by `seed + step` and a checkpoint with model, optimizer, step and RNG state make a run
#   resumable **exactly**, dropout included; plain-data checkpoints load with `weights_only=True`.
# * Start at `ln V`; report mean losses per token and `exp` of them as perplexity.
# * AdamW decays only what the data asks to shrink (section 4 measures the pull), every tensor once; warm-up then cosine to a floor; clip by the global
#   norm and log the norm before clipping.
# * Always watch a validation curve next to the training curve.
# * A budget is minutes: tokens per step trade against steps per minute, so compare recipes by loss
#   against wall time (the step curve times the measured ms/step), and end the schedule with the budget.
# * Gradient accumulation weights each micro-batch's loss by its share of the batch; bf16 autocast keeps
#   float32 weights and pays off only where the processor has bf16 matrix instructions.
#
# **Lab** (optional, about 15–20 minutes): `lessons/10_gpt2_pretraining_lab.ipynb` trains the same model
# size on TinyStories with GPT-2's tokenizer and a compacted vocabulary (unit 07's method).
