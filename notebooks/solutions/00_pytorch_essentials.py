# %% [markdown]
# # Unit 00 — PyTorch essentials: exercises
#
# Six graded exercises, 20 points. They are the small tools every later unit stands on: moving
# between `(B, T, D)` and per-head tensors, the course's causal mask, attention products with
# `einsum`, cross-entropy with label smoothing, the Noam learning-rate schedule, and a residual stack
# built from `nn.ModuleList`. Each exercise has a **task**, a cell for your code (replace
# `raise NotImplementedError()`), and a **test cell** with quick visible checks that prints
# `visible tests passed` when the basics hold.
#
# The grader runs more checks than you see here: other shapes and seeds, comparisons with PyTorch
# built-ins (`F.cross_entropy`, `torch.optim.lr_scheduler.LambdaLR`, `@`), and properties (round trips
# are exact, eval mode is deterministic, the learning-rate peak sits at the end of the warm-up). When
# something fails it tells you what was expected, what came back and, if your mistake is a known one,
# its name and a hint.
#
# **Check your work** at any time: save the notebook, then run in a terminal
#
# ```
# course check exercises/00_pytorch_essentials/00_pytorch_essentials.ipynb
# ```
#
# The grader reads only your `import`, `def` and `class` statements, so a function must not rely on a
# variable defined elsewhere in the notebook. Use only `torch`, `math` and the standard library.
# Conventions (from the lesson): activations are `(B, T, D)`, per-head tensors `(B, H, T, head_dim)`;
# masks are **boolean, `True` = may attend**.

# %%
import math

import torch
import torch.nn.functional as F
from torch import nn

import llmcourse

cfg = llmcourse.setup_notebook("00")

# %% [markdown]
# ## Exercise 1 — `split_heads` and `merge_heads` (3 points)
#
# ```python
# split_heads(x, n_heads)   # (B, T, D) -> (B, H, T, D // H)
# merge_heads(x)            # (B, H, T, hd) -> (B, T, H * hd), contiguous
# ```
#
# - `split_heads` cuts the last axis into `H` slices of width `hd = D // H` (view as `(B, T, H, hd)`)
#   and then swaps the `T` and `H` axes. Raise `ValueError` with a clear message if `D` is not
#   divisible by `n_heads`.
# - `merge_heads` undoes it: move the head axis back next to `head_dim`, then join the last two axes.
#   The result must be **contiguous**. Remember that `.view` refuses to work on a transposed tensor.
#
# `merge_heads(split_heads(x, H))` must give back `x` exactly, also when `x` itself is not contiguous.

# %% tags=["solution:00.split_merge_heads"]
def split_heads(x, n_heads):
    """(B, T, D) -> (B, H, T, D // H); ValueError if D % n_heads != 0."""
    ### BEGIN SOLUTION
    b, t, d = x.shape
    if d % n_heads != 0:
        raise ValueError(f"d_model={d} is not divisible by n_heads={n_heads}")
    return x.reshape(b, t, n_heads, d // n_heads).transpose(1, 2)
    ### END SOLUTION


def merge_heads(x):
    """(B, H, T, hd) -> (B, T, H * hd), contiguous."""
    ### BEGIN SOLUTION
    b, h, t, hd = x.shape
    return x.transpose(1, 2).contiguous().view(b, t, h * hd)
    ### END SOLUTION


# %% tags=["tests:00.split_merge_heads"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("00.split_merge_heads")  # noqa: E702
### END HIDDEN TESTS
x = torch.randn(2, 6, 16)
heads = split_heads(x, 4)
assert heads.shape == (2, 4, 6, 4), f"split_heads((2, 6, 16), 4) should be (2, 4, 6, 4), got {tuple(heads.shape)}"
assert torch.equal(heads[:, 1], x[:, :, 4:8]), "head 1 must hold features 4…7 of every token"
ctx = torch.randn(2, 4, 6, 4)  # a contiguous tensor, as attention returns it
merged = merge_heads(ctx)
assert merged.shape == (2, 6, 16) and merged.is_contiguous(), "merge_heads must give a contiguous (2, 6, 16)"
assert torch.equal(merge_heads(split_heads(x, 4)), x), "merge_heads(split_heads(x, 4)) must give back x exactly"
try:
    split_heads(torch.randn(2, 6, 15), 4)
    raise AssertionError("split_heads with D=15, n_heads=4 must raise ValueError")
except ValueError:
    pass
print("visible tests passed")

# %% [markdown]
# ## Exercise 2 — `causal_mask` (3 points)
#
# ```python
# causal_mask(t_q, t_k=None, offset=None, device=None)  # bool (t_q, t_k), True = may attend
# ```
#
# - `t_k` defaults to `t_q`; `offset` defaults to `t_k - t_q`.
# - Query row `i` sits at absolute position `offset + i`, so entry `(i, j)` is `True` iff
#   `j <= offset + i`. With the default offset the queries are the **last** `t_q` positions of the key
#   sequence (what a KV cache needs later).
# - Return a `torch.bool` tensor created on `device`.
#
# Example: `causal_mask(3, 5)` is `[[T,T,T,F,F], [T,T,T,T,F], [T,T,T,T,T]]`.

# %% tags=["solution:00.causal_mask"]
def causal_mask(t_q, t_k=None, offset=None, device=None):
    """Boolean (t_q, t_k) mask, True = may attend: entry (i, j) is j <= offset + i."""
    ### BEGIN SOLUTION
    t_k = t_q if t_k is None else t_k
    offset = t_k - t_q if offset is None else offset
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(diagonal=offset)
    ### END SOLUTION


# %% tags=["tests:00.causal_mask"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("00.causal_mask")  # noqa: E702
### END HIDDEN TESTS
m = causal_mask(4)
assert m.dtype == torch.bool and m.shape == (4, 4), f"expected a (4, 4) bool mask, got {m.dtype}, {tuple(m.shape)}"
assert m.diagonal().all(), "a token may always attend to itself: the diagonal must be True"
assert not m[0, 1], "True means 'may attend': query 0 must not see key 1 (the future)"
T_, F_ = True, False
assert causal_mask(3, 5).tolist() == [[T_, T_, T_, F_, F_], [T_, T_, T_, T_, F_], [T_, T_, T_, T_, T_]], \
    f"causal_mask(3, 5) gave {causal_mask(3, 5).int().tolist()}: the 3 queries are the last 3 of 5 positions"
assert causal_mask(1, 5).all(), "one new query sees the whole prefix"
print("visible tests passed")

# %% [markdown]
# ## Exercise 3 — attention products with `einsum` (3 points)
#
# ```python
# attention_scores_einsum(q, k)         # (B,H,Tq,d), (B,H,Tk,d)  -> (B,H,Tq,Tk), raw q·k (no scaling)
# attention_output_einsum(weights, v)   # (B,H,Tq,Tk), (B,H,Tk,dv) -> (B,H,Tq,dv)
# ```
#
# Write both with `torch.einsum` (the grader blocks `@`, `matmul` and `bmm` during your calls). Name the
# axes with letters; the letter of the axis you sum over must be the **same** in both inputs.
# `T_q` and `T_k` may differ, and so may `d` and `d_v`.

# %% tags=["solution:00.einsum_attention"]
def attention_scores_einsum(q, k):
    """Raw scores q · k for every (query, key) pair, with torch.einsum."""
    ### BEGIN SOLUTION
    return torch.einsum("bhqd,bhkd->bhqk", q, k)
    ### END SOLUTION


def attention_output_einsum(weights, v):
    """Context vectors: sum over keys of weights[..., q, k] * v[..., k, :], with torch.einsum."""
    ### BEGIN SOLUTION
    return torch.einsum("bhqk,bhkd->bhqd", weights, v)
    ### END SOLUTION


# %% tags=["tests:00.einsum_attention"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("00.einsum_attention")  # noqa: E702
### END HIDDEN TESTS
q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 4)
scores = attention_scores_einsum(q, k)
assert scores.shape == (2, 3, 5, 7), f"scores should be (B, H, T_q, T_k) = (2, 3, 5, 7), got {tuple(scores.shape)}"
assert torch.allclose(scores, q @ k.transpose(-2, -1), atol=1e-6), "scores differ from q @ k.transpose(-2, -1)"
weights = scores.softmax(dim=-1)
out = attention_output_einsum(weights, v)
assert out.shape == (2, 3, 5, 4), f"output should be (B, H, T_q, d_v) = (2, 3, 5, 4), got {tuple(out.shape)}"
assert torch.allclose(out, weights @ v, atol=1e-6), \
    "output differs from weights @ v: is the summed (key) axis the same letter in both inputs?"
print("visible tests passed")

# %% [markdown]
# ## Exercise 4 — `label_smoothed_cross_entropy` (4 points)
#
# ```python
# label_smoothed_cross_entropy(logits, targets, eps=0.0, ignore_index=-100)  # -> scalar tensor
# ```
#
# - `logits` `(N, C)` or `(B, T, C)` raw scores (class axis **last**); `targets` `(N,)` or `(B, T)` long.
# - Per position, with `log p = log_softmax(logits)`:
#   `(1 − ε)·(−log p_y) + (ε / C)·Σ_c (−log p_c)` — the ε mass goes to **all** `C` classes.
# - Positions whose target equals `ignore_index` count neither in the sum nor in the number you divide by;
#   return the mean over the other positions.
# - Do not call `F.cross_entropy` or `nn.CrossEntropyLoss` (the grader blocks them during your call).
#
# Example: logits `[[2.0, 1.0, 0.1]]`, target `[0]`: 0.4170 with ε = 0, 0.5137 with ε = 0.1.

# %% tags=["solution:00.label_smoothed_cross_entropy"]
def label_smoothed_cross_entropy(logits, targets, eps=0.0, ignore_index=-100):
    """Mean over non-ignored positions of (1-eps)*(-log p_y) + (eps/C)*sum_c(-log p_c)."""
    ### BEGIN SOLUTION
    n_classes = logits.shape[-1]
    log_probs = logits.reshape(-1, n_classes).log_softmax(dim=-1)
    y = targets.reshape(-1)
    keep = y != ignore_index
    safe_y = torch.where(keep, y, torch.zeros_like(y))
    nll = -log_probs.gather(1, safe_y.unsqueeze(1)).squeeze(1)
    uniform = -log_probs.mean(dim=-1)
    per_position = (1.0 - eps) * nll + eps * uniform
    per_position = torch.where(keep, per_position, torch.zeros_like(per_position))
    return per_position.sum() / keep.sum()
    ### END SOLUTION


# %% tags=["tests:00.label_smoothed_cross_entropy"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("00.label_smoothed_cross_entropy")  # noqa: E702
### END HIDDEN TESTS
logits = torch.tensor([[2.0, 1.0, 0.1]])
loss = label_smoothed_cross_entropy(logits, torch.tensor([0]))
assert loss.dim() == 0, f"the loss must be a scalar tensor, got shape {tuple(loss.shape)}"
assert abs(loss.item() - 0.4170) < 1e-4, f"plain cross-entropy should be 0.4170, got {loss.item():.4f}"
smoothed = label_smoothed_cross_entropy(logits, torch.tensor([0]), eps=0.1)
assert abs(smoothed.item() - 0.5137) < 1e-4, f"with eps=0.1 expected 0.5137, got {smoothed.item():.4f}"
z, y = torch.randn(2, 5, 7), torch.tensor([[1, 2, 3, -100, -100], [4, 5, 6, 0, -100]])
ours = label_smoothed_cross_entropy(z, y, eps=0.1)
theirs = F.cross_entropy(z.reshape(-1, 7), y.reshape(-1), label_smoothing=0.1)
assert torch.allclose(ours, theirs, atol=1e-5), f"with ignored positions: {ours.item():.5f} vs PyTorch {theirs.item():.5f}"
print("visible tests passed")

# %% [markdown]
# ## Exercise 5 — the Noam schedule (4 points)
#
# ```python
# noam_lambda(step, d_model, warmup) -> float    # d_model**-0.5 * min(s**-0.5, s * warmup**-1.5), s = max(step, 1)
# make_noam_scheduler(optimizer, d_model, warmup, factor=1.0) -> torch.optim.lr_scheduler.LambdaLR
# ```
#
# `make_noam_scheduler` must make the lr used by the n-th `optimizer.step()` (n = 1, 2, …) equal
# `factor · noam_lambda(n, d_model, warmup)` for every param group, when `scheduler.step()` is called
# after each `optimizer.step()`, **whatever lr the optimizer was created with** (the grader builds it
# with `lr=1e-4` and with several groups). The lesson's section on `LambdaLR` has what you need.
#
# Example (`d_model=512, warmup=4000`): λ(1) = 1.746928e-07, λ(4000) = 6.987712e-04 (the peak).

# %% tags=["solution:00.noam_schedule"]
def noam_lambda(step, d_model, warmup):
    """d_model**-0.5 * min(s**-0.5, s * warmup**-1.5) with s = max(step, 1)."""
    ### BEGIN SOLUTION
    s = max(step, 1)
    return d_model ** -0.5 * min(s ** -0.5, s * warmup ** -1.5)
    ### END SOLUTION


def make_noam_scheduler(optimizer, d_model, warmup, factor=1.0):
    """LambdaLR whose n-th optimizer step uses lr = factor * noam_lambda(n, d_model, warmup)."""
    ### BEGIN SOLUTION
    for group in optimizer.param_groups:
        group["lr"] = factor
        group["initial_lr"] = factor
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: noam_lambda(e + 1, d_model, warmup))
    ### END SOLUTION


# %% tags=["tests:00.noam_schedule"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("00.noam_schedule")  # noqa: E702
### END HIDDEN TESTS
assert math.isclose(noam_lambda(1, 512, 4000), 1.746928e-07, rel_tol=1e-6), noam_lambda(1, 512, 4000)
assert math.isclose(noam_lambda(4000, 512, 4000), 6.987712e-04, rel_tol=1e-6), "the peak is (512·4000)^-0.5"
param = nn.Parameter(torch.zeros(3))
opt = torch.optim.Adam([param], lr=1e-4)          # the trap: a small lr left in the optimizer
sched = make_noam_scheduler(opt, d_model=512, warmup=4000)
used = []
for _ in range(3):
    used.append(opt.param_groups[0]["lr"])
    opt.step()
    sched.step()
expected = [noam_lambda(n, 512, 4000) for n in (1, 2, 3)]
assert all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(used, expected)), \
    f"lr before steps 1, 2, 3 was {used}; expected λ(1), λ(2), λ(3) = {expected}"
print("visible tests passed")

# %% [markdown]
# ## Exercise 6 — `ResidualStack` (3 points)
#
# ```python
# ResidualStack(d_model, n_layers, dropout=0.0)   # forward: (..., d_model) -> same shape
# ```
#
# - `self.layers`: an `nn.ModuleList` of `n_layers` layers `nn.Linear(d_model, d_model)`;
#   `self.dropout = nn.Dropout(dropout)`. The `state_dict` keys are `layers.{i}.weight` and
#   `layers.{i}.bias`.
# - `forward(x)`: for each layer in order, `x = x + dropout(layer(x))` — dropout sits on the
#   **branch**, before the residual add. It must be active in `train()` mode only.
#
# `ResidualStack(16, 4)` has 4 · (16² + 16) = 1,088 parameters.

# %% tags=["solution:00.ResidualStack"]
class ResidualStack(nn.Module):
    def __init__(self, d_model, n_layers, dropout=0.0):
        super().__init__()
        ### BEGIN SOLUTION
        self.layers = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(n_layers)])
        self.dropout = nn.Dropout(dropout)
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        for layer in self.layers:
            x = x + self.dropout(layer(x))
        return x
        ### END SOLUTION


# %% tags=["tests:00.ResidualStack"]
### BEGIN HIDDEN TESTS
from grader import grade; grade("00.ResidualStack")  # noqa: E702
### END HIDDEN TESTS
stack = ResidualStack(16, 4, dropout=0.5)
n_params = sum(p.numel() for p in stack.parameters())
assert n_params == 1088, f"ResidualStack(16, 4) should have 1,088 parameters, found {n_params}"
assert sorted(stack.state_dict())[:2] == ["layers.0.bias", "layers.0.weight"], sorted(stack.state_dict())
x = torch.randn(2, 5, 16)
assert stack(x).shape == (2, 5, 16), "the output must have the input's shape"
stack.eval()
assert torch.equal(stack(x), stack(x)), "in eval() mode dropout must be off: two calls must agree"
print("visible tests passed")

# %% [markdown]
# ## Done?
#
# Save the notebook (Ctrl+S) and run the check cell below, `llmcourse.check()`, for the full report.
# From the next units on, the course imports the finished
# versions: `llmcourse.split_heads`, `llmcourse.merge_heads`, `llmcourse.causal_mask`,
# `llmcourse.label_smoothed_cross_entropy`, `llmcourse.make_noam_scheduler` and
# `llmcourse.nn.ResidualStack`.
