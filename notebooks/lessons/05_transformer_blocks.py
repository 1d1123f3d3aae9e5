# %% [markdown]
# # Unit 05 — Transformer blocks: LayerNorm, feed-forward, residuals
#
# Unit 04 gave us multi-head attention. Attention alone is not a transformer: every transformer
# layer wraps it, and a second sublayer, in the same small kit of parts. This lesson builds that kit
# and assembles it:
#
# 1. why activations need normalising, and why transformers use **LayerNorm** rather than BatchNorm;
# 2. LayerNorm from scratch: biased variance, where $\varepsilon$ goes, the scale $\gamma$ and shift $\beta$;
# 3. **residual connections** and an experiment that shows why deep stacks need them;
# 4. the position-wise **feed-forward network** with ReLU, exact GELU and the tanh approximation;
# 5. **post-LN** (the 2017 paper) versus **pre-LN** (GPT-2 onwards), and the final norm of a pre-LN stack;
# 6. the **encoder block** (self-attention + FFN);
# 7. the **decoder block** (masked self-attention + cross-attention + FFN);
# 8. the **projection layer** that turns the residual stream into logits;
# 9. parameter and compute accounting for one block.
#
# Every block we build is checked against PyTorch's own `nn.TransformerEncoderLayer` and
# `nn.TransformerDecoderLayer`, loaded with the same weights, in both norm placements.
#
# The exercise notebook (`exercises/05_transformer_blocks/05_transformer_blocks.ipynb`) asks you to write
# `LayerNorm`, `gelu`, `FeedForward`, `EncoderBlock`, `DecoderBlock` and `ProjectionLayer`. From unit 06
# on, the course imports the finished versions from `llmcourse.nn`.
#
# Cells marked **Spot the bug** reproduce mistakes found in popular write-ups. Run the buggy cell and see
# which property breaks, write your fix in the **TODO** cell and run its self-check (it prints "not yet"
# until the fix is right). A reference follows in a collapsed cell (click its margin to expand) that runs
# with the rest of the notebook. Where the fix *is* one of the exercises (LayerNorm, the FFN, the encoder
# block), the collapsed cell says what to change in words and runs the self-check on the library's
# finished version instead of showing code: your TODO cell is then a first test for that exercise.
#
# Conventions: activations are `(B, T, D)` = (batch, sequence, `d_model`); masks are boolean with
# **`True` = may attend**; a key-padding mask has shape `(B, 1, 1, T_k)`.

# %%
import math

import matplotlib.pyplot as plt

import torch
import torch.nn.functional as F
from torch import nn

import llmcourse
from llmcourse.nn import EncoderBlock, LayerNorm, MultiHeadAttention, causal_mask
from llmcourse.viz import blocks as viz

cfg = llmcourse.setup_notebook("05")
cfg

# %% [markdown]
# ## 1. Why normalise?
#
# A deep network applies one layer after another. If each layer multiplies the typical size of its
# input by a factor a little different from 1, the size after $L$ layers changes by that factor to the
# power $L$: activations drift towards 0 or towards infinity, and so do the gradients. Careful
# initialisation can keep the factor close to 1 at the start of training, but nothing keeps it there
# once the weights move.
#
# Below, a stack of `nn.Linear` layers with PyTorch's default initialisation. We print the RMS
# (root-mean-square) of the activations after each layer, with and without a normalisation after
# every layer.

# %%
torch.manual_seed(0)
depth = cfg["drift_depth"]
d = 64
layers = [nn.Linear(d, d) for _ in range(depth)]
x0 = torch.randn(32, d)


def rms(t):
    return t.pow(2).mean().sqrt().item()


with torch.no_grad():
    plain, normed = [rms(x0)], [rms(x0)]
    h1, h2 = x0, x0
    for layer in layers:
        h1 = layer(h1)
        h2 = F.layer_norm(layer(h2), (d,))   # a stand-in for now; we write our own LayerNorm below
        plain.append(rms(h1))
        normed.append(rms(h2))
print("RMS without normalisation:", [f"{v:.2g}" for v in plain])
print("RMS with normalisation:   ", [f"{v:.2g}" for v in normed])
assert plain[-1] < 0.2 * plain[0]                        # the signal shrinks layer after layer
assert all(abs(v - 1) < 1e-3 for v in normed[1:])          # normalised: RMS 1 after every layer

# %% [markdown]
# Without normalisation the RMS falls by almost half per layer until only the contribution of the
# biases is left (about 0.09 here): after half a dozen layers the output has nearly forgotten the
# input. With a normalisation after every layer the scale is pinned at 1.
#
# ### LayerNorm is not BatchNorm
#
# **BatchNorm** (2015, for image networks) computes a mean and variance for each feature *across the
# examples in the batch*. Because those statistics depend on the batch, it keeps **running averages**
# during training and uses them instead at evaluation time, so `train()` and `eval()` compute
# different functions.
#
# **LayerNorm** (Ba et al., 2016) computes the statistics for each token *across its own features*.
# Nothing depends on the other tokens or on the batch, there are no running statistics, and `train()`
# and `eval()` give identical outputs. That is what a language model wants: a batch holds sequences
# of different lengths with padding, generation runs with batch size 1, and the result for one token
# must not depend on which other sentences happened to share its batch.

# %%
torch.manual_seed(1)
x = torch.randn(8, 6) * 2 + 3
bn, ln = nn.BatchNorm1d(6), nn.LayerNorm(6)
bn_train, ln_train = bn.train()(x), ln.train()(x)
bn_eval, ln_eval = bn.eval()(x), ln.eval()(x)
print("BatchNorm: train and eval agree?", torch.allclose(bn_train, bn_eval), "| buffers:", [n for n, _ in bn.named_buffers()])
print("LayerNorm: train and eval agree?", torch.equal(ln_train, ln_eval), "| buffers:", [n for n, _ in ln.named_buffers()])
assert not torch.allclose(bn_train, bn_eval) and torch.equal(ln_train, ln_eval)
assert len(list(ln.buffers())) == 0

# one token alone: LayerNorm does not care about the batch, BatchNorm in training mode cannot even run
print("LayerNorm on a single token:", ln(x[:1]).shape)
try:
    bn.train()(x[:1])
except ValueError as err:
    print("BatchNorm on a single example in train mode:", err)

# %% [markdown]
# ## 2. LayerNorm from scratch
#
# For one token $x \in \mathbb{R}^D$:
#
# $$\mu = \frac1D\sum_i x_i,\qquad \sigma^2 = \frac1D\sum_i (x_i-\mu)^2,\qquad
# \mathrm{LayerNorm}(x) = \frac{x-\mu}{\sqrt{\sigma^2+\varepsilon}}\odot\gamma + \beta .$$
#
# Three details matter, and each has a wrong version in circulation:
#
# * the variance is the **biased** one, dividing by $D$. `torch.var` divides by $D-1$ by default
#   ("unbiased"); LayerNorm needs `unbiased=False` (or `correction=0`);
# * $\varepsilon$ (`1e-5`) sits **inside** the square root; it only matters when a token is nearly
#   constant, but then it is the difference between a finite output and a division by almost zero;
# * $\gamma$ (`weight`, initialised to 1) **scales** and $\beta$ (`bias`, initialised to 0) **shifts**,
#   one value per feature, so the network can undo the normalisation where that helps.
#
# A worked example: the vector $[-1.5, -0.5, 0.5, 1.5]$ has mean 0 and looks "normalised", but its
# biased standard deviation is $\sqrt{(2.25+0.25+0.25+2.25)/4} = \sqrt{1.25} \approx 1.118$, not 1.

# %%
v = torch.tensor([-1.5, -0.5, 0.5, 1.5])
print(f"mean {v.mean():.3f}, biased std {v.std(unbiased=False):.4f}, unbiased std {v.std():.4f}")
assert abs(v.std(unbiased=False).item() - 1.118) < 1e-3


# `LayerNorm` below is the library's (`llmcourse.nn.LayerNorm`); you write your own in the exercises,
# and these are the tests it has to pass.
mine = LayerNorm(4)
print("normalised:", mine(v).detach(), " biased std:", round(mine(v).std(unbiased=False).item(), 6))

# %% [markdown]
# Checks against PyTorch. The `state_dict` keys (`weight`, `bias`) are the same as `nn.LayerNorm`'s,
# so weights load across. `nn.LayerNorm(D)` has $2D$ parameters and no buffers.

# %%
D = 16
torch.manual_seed(2)
mine, ref = LayerNorm(D), nn.LayerNorm(D)
with torch.no_grad():
    mine.weight.normal_(1.0, 0.3)
    mine.bias.normal_(0.0, 0.3)
ref.load_state_dict(mine.state_dict())
x = torch.randn(3, 5, D) * 4 + 1
diff = (mine(x) - ref(x)).abs().max().item()
print(f"max |LayerNorm − nn.LayerNorm| = {diff:.2e}")
assert diff < 1e-5
print("nn.LayerNorm(16): parameters", sum(p.numel() for p in ref.parameters()), "| buffers", len(list(ref.buffers())),
      "| keys", list(ref.state_dict()))
assert sum(p.numel() for p in ref.parameters()) == 2 * D and len(list(ref.buffers())) == 0

# %% [markdown]
# **A number that does not depend on the data.** For any input of shape `(2, 4, 16)`
# whose tokens are not constant, each of the 8 tokens comes out of `LayerNorm(16)` (with γ = 1, β = 0)
# with mean 0 and biased variance $1-O(\varepsilon)$. Pool all 128 numbers and take the usual
# *unbiased* standard deviation: $\sqrt{128/127} \approx 1.00393$.

# %%
for seed in range(3):
    torch.manual_seed(seed)
    x = torch.randn(2, 4, 16) * (seed + 1) + 5 * seed
    s = LayerNorm(16)(x).std().item()
    print(f"seed {seed}: std of all 128 outputs = {s:.5f}")
    assert abs(s - math.sqrt(128 / 127)) < 1e-4
print(f"sqrt(128/127) = {math.sqrt(128 / 127):.5f}")

# %% [markdown]
# ### Spot the bug: LayerNorm as some write-ups print it
#
# The version below circulates in write-ups and looks like the formula above, line by line. Run the
# parity check against `F.layer_norm` on typical tokens and on tokens whose features barely vary, and
# find what differs from the formula. (The correct formula is the first exercise; here the library's
# `LayerNorm`, with γ = 1 and β = 0, plays the fixed version.)

# %%
def layer_norm_buggy(x, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    return (x - mean) / (x.std(-1, keepdim=True) + eps)


def layer_norm_library(x, eps=1e-5):
    return LayerNorm(x.shape[-1], eps=eps)(x).detach()


def parity(fn, x):
    return (fn(x) - F.layer_norm(x, x.shape[-1:])).abs().max().item()


torch.manual_seed(3)
x_typical = torch.randn(4, 16)
x_flat = torch.randn(4, 16) * 1e-3          # nearly constant tokens: here eps matters
for name, fn in (("buggy", layer_norm_buggy), ("library", layer_norm_library)):
    print(f"{name}: max diff vs F.layer_norm, typical tokens {parity(fn, x_typical):.2e}, "
          f"nearly-constant tokens {parity(fn, x_flat):.2e}")
assert parity(layer_norm_buggy, x_typical) > 1e-2      # the wrong variance: about 3 % off for D = 16
assert parity(layer_norm_library, x_typical) < 1e-5 and parity(layer_norm_library, x_flat) < 1e-4

# %% [markdown]
# **Your fix.** Rewrite `layer_norm_mine(x, eps)` (γ = 1, β = 0) so that it matches `F.layer_norm` on typical
# and on nearly constant tokens. Then run the self-check.

# %%
def layer_norm_mine(x, eps=1e-5):
    # TODO: agree with F.layer_norm on typical and on nearly constant tokens
    mean = x.mean(-1, keepdim=True)
    return (x - mean) / (x.std(-1, keepdim=True) + eps)


def self_check_layer_norm(fn):
    typical, flat = parity(fn, x_typical), parity(fn, x_flat)
    ok = typical < 1e-5 and flat < 1e-4
    print("✓ matches F.layer_norm on typical and nearly constant tokens" if ok else
          f"✗ not yet: max difference {typical:.2e} (typical tokens), {flat:.2e} (nearly constant tokens)")
    return ok


self_check_layer_norm(layer_norm_mine)

# %% jupyter={"source_hidden": true}
# Reference (collapsed; the fix is exercise 1, so here in words): use the biased variance (divide by D,
# `unbiased=False`) and add eps to the variance *inside* the square root. The library's LayerNorm does both:
assert self_check_layer_norm(layer_norm_library)

# %% [markdown]
# ### Spot the bug: "LayerNorm uses batch statistics in training and running statistics in evaluation"
#
# That sentence describes BatchNorm. Here is a module written from it; the property that catches it is
# the one from section 1: a LayerNorm must compute the same function in `train()` and `eval()` and
# must have no buffers.

# %%
class RunningStatsNorm(LayerNorm):
    """What the sentence describes (wrong for LayerNorm): γ, β and eps as in LayerNorm, plus running statistics."""

    def __init__(self, d_model, eps=1e-5):
        super().__init__(d_model, eps)
        self.register_buffer("running_mean", torch.zeros(d_model))
        self.register_buffer("running_var", torch.ones(d_model))

    def forward(self, x):
        if self.training:
            flat = x.reshape(-1, x.shape[-1])
            mean, var = flat.mean(0), flat.var(0, unbiased=False)
            with torch.no_grad():
                self.running_mean.lerp_(mean, 0.1)
                self.running_var.lerp_(var, 0.1)
        else:
            mean, var = self.running_mean, self.running_var
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


def train_eval_agree(module, x):
    return torch.allclose(module.train()(x), module.eval()(x), atol=1e-6) and not list(module.buffers())


x = torch.randn(2, 5, 16) * 3 + 1
print("running-stats 'LayerNorm': train == eval and no buffers?", train_eval_agree(RunningStatsNorm(16), x))
print("LayerNorm:                 train == eval and no buffers?", train_eval_agree(LayerNorm(16), x))
assert not train_eval_agree(RunningStatsNorm(16), x) and train_eval_agree(LayerNorm(16), x)

# %% [markdown]
# **Your fix.** `TokenNorm(d_model, eps)` keeps γ, β and eps of `LayerNorm` and rewrites `forward`. It must
# compute the same function in `train()` and `eval()`, hold no buffers, and match
# `F.layer_norm(x, (d_model,), γ, β, eps)` for any γ and β.

# %%
class TokenNorm(LayerNorm):
    def forward(self, x):
        # TODO: whose statistics normalise a token?
        flat = x.reshape(-1, x.shape[-1])
        mean, var = flat.mean(0), flat.var(0, unbiased=False)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


def self_check_token_norm(cls, x=x):
    norm = cls(16)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.normal_()
    want = F.layer_norm(x, (16,), norm.weight, norm.bias, norm.eps)
    ok = train_eval_agree(norm, x) and torch.allclose(norm.eval()(x), want, atol=1e-5)
    print("✓ each token normalised by its own features, in train and eval alike" if ok else
          "✗ not yet: the output differs from F.layer_norm, between train() and eval(), or the module has buffers")
    return ok


self_check_token_norm(TokenNorm)

# %% jupyter={"source_hidden": true}
# Reference (collapsed; the fix is exercise 1, so here in words): take the mean and the biased variance of
# each token over its own D features (the last axis, keepdim), never over the batch, and keep no running
# statistics. The library's LayerNorm passes the same self-check:
assert self_check_token_norm(LayerNorm)

# %% [markdown]
# Move γ and β, and pick another token: the histogram of the token's 16 features is standardised
# first (mean 0, std 1), then stretched by γ and moved by β.

# %% tags=["nbval-ignore-output"]
viz.show_layernorm()

# %% [markdown]
# The library's `llmcourse.nn.LayerNorm` agrees with PyTorch's functional form too.

# %%
x = torch.randn(3, 7, 16)
assert torch.allclose(LayerNorm(16)(x), F.layer_norm(x, (16,)), atol=1e-6)

# %% [markdown]
# ## 3. Residual connections
#
# A residual (or shortcut) connection computes $y = x + f(x)$ instead of $y = f(x)$. The sublayer $f$
# only has to learn a *change* to its input, and the identity path carries the signal through
# untouched. For the gradient this is decisive. By the chain rule
#
# $$\frac{\partial y}{\partial x} = I + \frac{\partial f}{\partial x},$$
#
# so backpropagating through $L$ residual layers multiplies $L$ factors of the form $I + J_\ell$. Without
# shortcuts it multiplies $L$ Jacobians $J_\ell$ alone, and if each shrinks vectors, the product
# shrinks geometrically: the first layers receive almost no gradient (the *vanishing gradient*).
#
# **The experiment.** Eight layers of `[Linear(16, 16), Sigmoid]` (the sigmoid's
# derivative is at most 1/4), `torch.manual_seed(123)`, input `ones(4, 16)`, loss `mean(out²)`. We
# compare the mean absolute gradient of each layer's weight with and without shortcuts.

# %%
plain = viz.residual_gradient_profile(depth=8, shortcut=False)
short = viz.residual_gradient_profile(depth=8, shortcut=True)
print("layer   without shortcuts   with shortcuts")
for i, (a, b) in enumerate(zip(plain, short), start=1):
    print(f"{i:5d}   {a:17.2e}   {b:14.2e}")
print(f"first layer: ratio with/without = {short[0] / plain[0]:.1e}")
assert short[0] / plain[0] > 1e4                    # orders of magnitude apart
assert plain[0] < 1e-6 < 1e-2 < short[0]             # ≈ 2.7e-08 without, ≈ 1.5e-01 with
assert 1e-3 < plain[-1] < 1e-1 < short[-1]           # last layer ≈ 7.6e-03 and ≈ 4.5e-01

# %% [markdown]
# Without shortcuts the gradient falls by a factor of about 4 to 10 per layer on its way back to the
# input; with them it stays within one order of magnitude across the stack. Try other depths and
# activations in the widget: at the origin the sigmoid's derivative is 0.25, GELU's 0.5 and tanh's 1
# (computed below with autograd), so the effect is milder with them, but it is still there at depth 32.

# %%
slopes = {}
for name, fn in (("sigmoid", torch.sigmoid), ("GELU", F.gelu), ("tanh", torch.tanh)):
    z0 = torch.zeros((), requires_grad=True)
    fn(z0).backward()
    slopes[name] = z0.grad.item()
print("derivative at 0:", {k: round(v, 4) for k, v in slopes.items()})
assert slopes == {"sigmoid": 0.25, "GELU": 0.5, "tanh": 1.0}

# %% tags=["nbval-ignore-output"]
viz.show_residual_gradients()

# %% [markdown]
# ## 4. The position-wise feed-forward network
#
# The second sublayer of every block is a small MLP applied to **each position separately**, with the
# same weights at every position:
#
# $$\mathrm{FFN}(x) = \mathrm{act}(x W_1 + b_1)\, W_2 + b_2,\qquad W_1 \in \mathbb{R}^{D\times d_{ff}},\ W_2 \in \mathbb{R}^{d_{ff}\times D}.$$
#
# Attention mixes information *between* positions; the FFN transforms each position's vector on its
# own. The hidden width $d_{ff}$ is usually $4D$ (2048 for $D = 512$ in the original Transformer, 3072
# for $D = 768$ in GPT-2).
#
# **Activations.** The 2017 Transformer uses ReLU, $\max(0, x)$. BERT and GPT use GELU,
# $\mathrm{GELU}(x) = x\,\Phi(x)$, where $\Phi$ is the standard normal CDF: a smooth ReLU that lets
# small negative values through, weighted by how likely a standard normal is to be below them:
#
# * exact: $0.5\,x\,(1 + \mathrm{erf}(x/\sqrt2))$, PyTorch's `F.gelu(x)`;
# * tanh approximation: $0.5\,x\,(1 + \tanh(\sqrt{2/\pi}\,(x + 0.044715\,x^3)))$, from a time when
#   `erf` was slow. GPT-2 was trained with it, so loading GPT-2 weights (unit 08) needs exactly this one
#   (`F.gelu(x, approximate="tanh")`; `transformers` calls it `gelu_new`).
#
# How different are they?

# %%
from llmcourse.nn import FeedForward, gelu  # noqa: E402

xs = torch.linspace(-8, 8, 160_001, dtype=torch.float64)
gap = (gelu(xs, "none") - gelu(xs, "tanh")).abs()
i = int(gap.argmax())
print(f"max |exact − tanh| on [−8, 8] = {gap[i].item():.3e} at x = {xs[i].item():.3f}")
m3 = torch.tensor([-3.0])
print(f"x = −3: exact {gelu(m3).item():.5f}, tanh {gelu(m3, 'tanh').item():.5f}")
assert abs(gap[i].item() - 4.74e-4) < 5e-6 and abs(xs[i].item() + 2.70) < 0.02
assert abs(gelu(m3).item() + 0.00405) < 1e-5 and abs(gelu(m3, "tanh").item() + 0.00364) < 1e-5
assert torch.allclose(gelu(xs), F.gelu(xs), atol=1e-6)          # both formulas agree with PyTorch's
assert torch.allclose(gelu(xs, "tanh"), F.gelu(xs, approximate="tanh"), atol=1e-6)

# %% [markdown]
# Less than $5\times10^{-4}$ apart, yet not interchangeable: a model trained with one and evaluated
# with the other sees slightly different activations in every layer, and the checks in unit 08 compare
# logits at `1e-5`.

# %% tags=["nbval-ignore-output"]
viz.show_activations()

# %% [markdown]
# The FFN module: `fc1` (`D → d_ff`), activation, `fc2` (`d_ff → D`). Its parameter count is
# $2\,D\,d_{ff} + d_{ff} + D$; for $D = 512$, $d_{ff} = 2048$ that is 2,099,712. "Position-wise" is a
# property we can test: permuting the positions of the input permutes the outputs the same way.

# %%
ffn = FeedForward(512, 2048)
n_ffn = sum(p.numel() for p in ffn.parameters())
print(f"FeedForward(512, 2048): {n_ffn:,} parameters; keys {list(ffn.state_dict())}")
assert n_ffn == 2 * 512 * 2048 + 2048 + 512 == 2_099_712

torch.manual_seed(4)
small = FeedForward(8, 32, "gelu")
x = torch.randn(2, 6, 8)
perm = torch.randperm(6)
assert torch.allclose(small(x)[:, perm], small(x[:, perm]), atol=1e-6)
print("permuting positions permutes the outputs: the FFN is position-wise")

# %% [markdown]
# ### Two designs: a dropout inside the FFN, or not
#
# Where the regularising dropout of the FFN sublayer goes is a design choice. PyTorch's own
# `nn.TransformerEncoderLayer` (its `_ff_block`), the Annotated Transformer and tensor2tensor put a
# dropout **between** `fc1` and `fc2` as well as the residual dropout after the sublayer; GPT-2 and this
# course leave the inner one out: the FFN itself is deterministic and the block's residual dropout
# does the regularising. The cell below measures both: PyTorch's FFN path is random in `train()`, the
# course's is not. Exercise 3's contract is the course's design.

# %%
class FFNWithInnerDropout(nn.Module):
    def __init__(self, d_model, d_ff, p=0.1):
        super().__init__()
        self.fc1, self.fc2, self.drop = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model), nn.Dropout(p)

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def deterministic_in_train(module, x):
    module.train()
    return torch.equal(module(x), module(x))


x = torch.randn(2, 6, 8)
torch_layer = nn.TransformerEncoderLayer(8, 2, 32, dropout=0.1, batch_first=True).train()
torch_ffn_random = not torch.equal(torch_layer._ff_block(x), torch_layer._ff_block(x))
print("nn.TransformerEncoderLayer's dropouts:",
      [name for name, m in torch_layer.named_modules() if isinstance(m, nn.Dropout)],
      "| its FFN path random in train()?", torch_ffn_random)
assert torch_ffn_random
print("FFN with inner dropout deterministic in train()?", deterministic_in_train(FFNWithInnerDropout(8, 32), x))
print("course FeedForward deterministic in train()?    ", deterministic_in_train(FeedForward(8, 32), x))
assert not deterministic_in_train(FFNWithInnerDropout(8, 32), x) and deterministic_in_train(FeedForward(8, 32), x)

# %% [markdown]
# **Your fix.** Rewrite `forward` of `FFNFixed` (same layers as the buggy module) so that the FFN itself is
# deterministic: in `train()` it must give the same output twice, and the same output as in `eval()`.

# %%
class FFNFixed(FFNWithInnerDropout):
    def forward(self, x):
        # TODO: the course's design: deterministic in train() and equal to eval()
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def self_check_ffn(cls, x=x):
    module = cls(8, 32)
    ok = deterministic_in_train(module, x) and torch.equal(module.train()(x), module.eval()(x))
    print("✓ the FFN is deterministic; the block's residual dropout does the regularising" if ok else
          "✗ not yet: in train() the FFN's output is random")
    return ok


self_check_ffn(FFNFixed)

# %% jupyter={"source_hidden": true}
# Reference (collapsed; the FFN is exercise 3, so here in words): no dropout between the two linear layers;
# the block's residual dropout does the regularising. The library's FeedForward passes the same self-check:
assert self_check_ffn(FeedForward)

# %% [markdown]
# ## 5. Post-LN versus pre-LN
#
# Each sublayer $f$ (attention or FFN) gets a residual connection, a LayerNorm and a dropout. There are
# two ways to arrange them:
#
# | | formula | used by |
# |---|---|---|
# | **post-LN** | $x \leftarrow \mathrm{LN}(x + f(x))$ | the 2017 Transformer, BERT |
# | **pre-LN** | $x \leftarrow x + f(\mathrm{LN}(x))$ | GPT-2 and nearly every model since |
#
# In post-LN the residual stream is renormalised after every sublayer, so it never grows, but every
# gradient on its way back to the first layers passes through all the norms. At initialisation the
# gradients of the last layers are larger than those of the first, and training with a large learning
# rate from step 0 tends to diverge: post-LN needs a learning-rate **warmup** (Xiong et al., 2020,
# analyse this; the Noam schedule of unit 00 has one built in).
#
# In pre-LN the identity path runs from the input to the output without any norm on it: each block
# *adds* its contribution to the stream. Gradients reach the first layers through the identity path,
# and training is stable with little or no warmup. The price: the stream's scale grows with depth, so a
# pre-LN **stack must end with one final LayerNorm** before the output projection.
#
# We measure both at initialisation with the same weights (a stack of the course's encoder blocks,
# built in section 6): the RMS of the residual stream after each block, and the gradient norm of each
# block's parameters.

# %%
depth = cfg["prepost_depth"]
prof = viz.pre_post_ln_profile(depth=depth)
for name in ("pre", "post"):
    print(f"{name}-LN  stream RMS: {[round(r, 2) for r in prof[name]['rms']]}")
    print(f"{name}-LN  grad norm per block: {[f'{g:.2f}' for g in prof[name]['grad']]}")
assert all(abs(r - 1) < 1e-3 for r in prof["post"]["rms"][1:])    # post-LN: renormalised after every block
assert prof["pre"]["rms"][-1] > prof["pre"]["rms"][0]             # pre-LN: the stream grows with depth

# %% tags=["nbval-ignore-output"]
viz.show_pre_post_ln()

# %% [markdown]
# **Warmup, measured.** The claim "post-LN needs a warmup" is about training, so we train. Three copies
# of the same small character-level language model (6 blocks, $D = 32$, 4 heads, causal mask, token +
# learned position embeddings, on the first 200,000 characters of tinyshakespeare) start from identical
# weights and see identical batches under Adam with a deliberately large learning rate: post-LN without
# warmup, post-LN with a linear warmup, and pre-LN without warmup. We compare the mean training loss of
# the last 20 steps. (Sizes come from `course.toml`; under the `ci` profile the run is far too short to
# mean anything and only checks that the code works.)

# %%
from tqdm.auto import tqdm  # noqa: E402

text_ws = llmcourse.load_text("tinyshakespeare")[:200_000]
chars_ws = sorted(set(text_ws))
data_ws = torch.tensor([chars_ws.index(c) for c in text_ws])
T_ws, B_ws, D_ws = 32, 16, 32


class TinyCharLM(nn.Module):
    """Embeddings, a stack of causal EncoderBlocks (pre- or post-LN), a final norm for pre-LN, a linear head."""

    def __init__(self, norm_first, layers):
        super().__init__()
        self.tok, self.pos = nn.Embedding(len(chars_ws), D_ws), nn.Embedding(T_ws, D_ws)
        self.blocks = nn.ModuleList([EncoderBlock(D_ws, 4, 4 * D_ws, dropout=0.0, norm_first=norm_first)
                                     for _ in range(layers)])
        self.final = LayerNorm(D_ws) if norm_first else nn.Identity()
        self.head = nn.Linear(D_ws, len(chars_ws))

    def forward(self, ids):
        h = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for blk in self.blocks:
            h = blk(h, mask=causal_mask(ids.shape[1]))
        return self.head(self.final(h))


def train_run(norm_first, warmup, steps=cfg["warmup_demo_steps"], lr=cfg["warmup_demo_lr"]):
    torch.manual_seed(0)
    model = TinyCharLM(norm_first, cfg["warmup_demo_layers"])
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        starts = torch.randint(0, len(data_ws) - T_ws - 1, (B_ws,), generator=g)
        xb = torch.stack([data_ws[i:i + T_ws] for i in starts])
        yb = torch.stack([data_ws[i + 1:i + T_ws + 1] for i in starts])
        loss = F.cross_entropy(model(xb).flatten(0, 1), yb.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses


runs = {}
settings = [("post-LN, no warmup", False, 0), ("post-LN, warmup", False, cfg["warmup_demo_warmup"]),
            ("pre-LN, no warmup", True, 0)]
for name, norm_first, warmup in tqdm(settings, desc="training runs"):
    runs[name] = train_run(norm_first, warmup)
final_loss = {name: sum(ls[-20:]) / len(ls[-20:]) for name, ls in runs.items()}
for name, v in final_loss.items():
    print(f"{name:20s}: mean loss of the last 20 steps {v:.3f}")
best = min(final_loss, key=final_loss.get)
gain = final_loss["post-LN, no warmup"] - final_loss["post-LN, warmup"]
print(f"lowest: {best}. Warmup {'lowered' if gain > 0 else 'did not lower'} post-LN's final loss "
      f"(by {gain:+.3f}); pre-LN without warmup {'matched or beat' if final_loss['pre-LN, no warmup'] <= final_loss['post-LN, warmup'] else 'stayed above'} post-LN with warmup.")

# %% tags=["nbval-ignore-output"]
fig, ax = plt.subplots(figsize=(6.5, 3.4))
for name, ls in runs.items():
    smooth = torch.tensor(ls).unfold(0, 10, 1).mean(1) if len(ls) >= 10 else torch.tensor(ls)
    ax.plot(smooth.numpy(), label=name)
ax.set_xlabel("step")
ax.set_ylabel("training loss (10-step mean)")
ax.set_title(f"lr {cfg['warmup_demo_lr']:g}, {cfg['warmup_demo_layers']} blocks, profile '{cfg['name']}'")
ax.legend()
plt.show()

# %% [markdown]
# What to look for: does warmup lower post-LN's final loss, and does pre-LN without any warmup do at least
# as well? That is the pattern Xiong et al. analyse; the cell above prints the answer for your profile.
# The gap is small at this size and depends on the learning rate and the seed; try a larger `lr` in
# `train_run` and watch post-LN without warmup stall near the unigram loss while pre-LN keeps learning.

# %% [markdown]
# ### Spot the bug: a pre-LN stack without its final norm
#
# A pre-LN stack whose last block feeds the output layer directly hands it an un-normalised stream
# whose scale depends on the depth. The property: the last hidden state of a pre-LN model should have
# per-token RMS ≈ 1 (times the final norm's γ) whatever the depth.

# %%
torch.manual_seed(5)
stack = nn.ModuleList([EncoderBlock(32, 4, 64, dropout=0.0, norm_first=True) for _ in range(8)]).eval()
final_norm = LayerNorm(32)
x = torch.randn(2, 10, 32)


def run_stack_buggy(blocks, x):
    """Pre-LN stack -> the hidden state handed to the output layer (as the buggy snippet does it)."""
    for blk in blocks:
        x = blk(x)
    return x                      # <- straight to the output layer


def final_rms_ok(run, depths=(1, 4, 8)):
    """Self-check: the hidden state handed to the output layer has RMS 1 (final norm's γ = 1) at every depth."""
    with torch.no_grad():
        return {d: round(rms(run(stack[:d], x)), 3) for d in depths}


print("RMS of the output at depths 1, 4, 8 (buggy):", final_rms_ok(run_stack_buggy))

# %% [markdown]
# **Your fix.** Rewrite `run_stack(blocks, x)` so that the hidden state it returns is ready for the output
# layer whatever the depth (use the notebook's `final_norm`, `LayerNorm(32)`). Then run the self-check.

# %%
def run_stack(blocks, x):
    # TODO: what must happen after the last pre-LN block?
    for blk in blocks:
        x = blk(x)
    return x


def self_check_run_stack():
    got = final_rms_ok(run_stack)
    ok = all(abs(r - 1) < 1e-3 for r in got.values())
    print("✓ RMS 1 at every depth" if ok else f"✗ not yet: RMS by depth {got}, should be 1 at every depth")
    return ok


fixed_final_norm = self_check_run_stack()

# %% jupyter={"source_hidden": true}
# Reference fix (collapsed): one LayerNorm after the last block. Running it replaces your version.
def run_stack(blocks, x):
    for blk in blocks:
        x = blk(x)
    return final_norm(x)


assert self_check_run_stack()
with torch.no_grad():
    without, with_final = run_stack_buggy(stack, x), run_stack(stack, x)
print(f"RMS of the output without a final norm: {rms(without):.3f}; with it: {rms(with_final):.3f}")
assert abs(rms(with_final) - 1) < 1e-3 and abs(rms(without) - 1) > 0.05

# %% [markdown]
# ## 6. The encoder block
#
# An encoder block is self-attention followed by the FFN, each wrapped as above. The encoder sees the
# whole sentence, so its self-attention is **not** causal; the only mask is the key-padding mask that
# hides padding tokens `(B, 1, 1, T)`. With pre-LN:
#
# ```
# x = x + self_attn(norm1(x), mask=mask)     (+ residual dropout: where exactly is exercise 4)
# x = x + ffn(norm2(x))
# ```
#
# The course's `EncoderBlock(d_model, num_heads, d_ff, dropout=0.1, norm_first=True, activation="relu",
# qkv_bias=True)` holds `self_attn` (unit 04's `MultiHeadAttention`), `norm1`, `norm2`, `ffn` and
# `dropout`. Writing it is an exercise; here we use the library's block and test the properties that pin
# it down: parity with PyTorch in both placements, and padding invariance.

# %%
print(EncoderBlock(16, 4, 32))

# %% [markdown]
# **Parity with PyTorch.** `nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout,
# activation, batch_first=True, norm_first=...)` implements the same block. Its attention packs the three
# projections into one `in_proj_weight = cat([W_q, W_k, W_v])` (unit 04), its FFN is `linear1`/`linear2`,
# and its padding mask `src_key_padding_mask` uses the opposite polarity (`True` = padding). We copy the
# weights across and compare, in **both** norm placements, and we also run the same weights through the
# *other* placement to see that the outputs genuinely differ.

# %%
def copy_mha(dst, src):
    dst.in_proj_weight.copy_(torch.cat([src.W_query.weight, src.W_key.weight, src.W_value.weight]))
    dst.in_proj_bias.copy_(torch.cat([src.W_query.bias, src.W_key.bias, src.W_value.bias]))
    dst.out_proj.weight.copy_(src.out_proj.weight)
    dst.out_proj.bias.copy_(src.out_proj.bias)


@torch.no_grad()
def to_torch_encoder(block):
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=block.norm_first)
    copy_mha(layer.self_attn, block.self_attn)
    for mine_, theirs in ((block.ffn.fc1, layer.linear1), (block.ffn.fc2, layer.linear2),
                          (block.norm1, layer.norm1), (block.norm2, layer.norm2)):
        theirs.weight.copy_(mine_.weight)
        theirs.bias.copy_(mine_.bias)
    return layer.eval()


x = torch.randn(3, 7, 16)
keep = torch.arange(7)[None, :] < torch.tensor([7, 5, 2])[:, None]      # True = real token
results = {}
for norm_first in (True, False):
    torch.manual_seed(6)
    blk = EncoderBlock(16, 4, 32, dropout=0.0, norm_first=norm_first).eval()
    with torch.no_grad():                      # non-trivial norms, so a swapped placement cannot hide
        for name, p in blk.named_parameters():
            if name.startswith("norm"):
                p.add_(0.3 * torch.randn_like(p))
    ours = blk(x, mask=keep[:, None, None, :])
    torch_out = to_torch_encoder(blk)(x, src_key_padding_mask=~keep)
    blk.norm_first = not norm_first
    swapped = blk(x, mask=keep[:, None, None, :])
    results[norm_first] = ((ours - torch_out).abs().max().item(), (swapped - torch_out).abs().max().item())
    label = "pre-LN " if norm_first else "post-LN"
    print(f"{label}: max |ours − torch| = {results[norm_first][0]:.2e};  other placement: {results[norm_first][1]:.2e}")
    assert results[norm_first][0] < 1e-5 and results[norm_first][1] > 1e-2

# %% [markdown]
# **Padding invariance.** Padding tokens are masked out as keys, so appending more padding (with any
# content) must leave the outputs at the real positions unchanged.

# %%
from llmcourse.nn import DecoderBlock, ProjectionLayer  # noqa: E402

torch.manual_seed(7)
enc = EncoderBlock(16, 4, 32, dropout=0.0).eval()
x_more = torch.cat([x, 100 * torch.randn(3, 4, 16)], dim=1)
keep_more = torch.cat([keep, torch.zeros(3, 4, dtype=torch.bool)], dim=1)
a = enc(x, mask=keep[:, None, None, :])
b = enc(x_more, mask=keep_more[:, None, None, :])[:, :7]
print("max change at real positions after adding 4 padding tokens:", (a - b)[keep].abs().max().item())
assert torch.allclose(a[keep], b[keep], atol=1e-5)

# %% [markdown]
# ### Spot the bug: a "modern" encoder that is post-LN
#
# A snippet sold as a modern (pre-LN) encoder layer computes `x = norm(x + attn(x))`. The parity test
# settles which placement a block implements: compare with `nn.TransformerEncoderLayer(norm_first=True)`
# and with `norm_first=False`, using the same weights.

# %%
class ModernEncoderClaimed(EncoderBlock):
    def forward(self, x, mask=None):           # advertised as pre-LN ...
        x = self.norm1(x + self.self_attn(x, mask=mask))
        return self.norm2(x + self.ffn(x))     # ... but this is post-LN


torch.manual_seed(8)
claimed = ModernEncoderClaimed(16, 4, 32, dropout=0.0, norm_first=True).eval()
with torch.no_grad():
    for name, p in claimed.named_parameters():
        if name.startswith("norm"):
            p.add_(0.3 * torch.randn_like(p))
out = claimed(x)
as_pre = to_torch_encoder(claimed)(x)                  # norm_first=True reference
claimed.norm_first = False
as_post = to_torch_encoder(claimed)(x)                 # the same weights, post-LN reference
print(f"matches pre-LN: {torch.allclose(out, as_pre, atol=1e-5)}; matches post-LN: {torch.allclose(out, as_post, atol=1e-5)}")
assert not torch.allclose(out, as_pre, atol=1e-5) and torch.allclose(out, as_post, atol=1e-5)

# %% [markdown]
# **Your fix.** Rewrite `forward` of `ModernEncoderFixed` so that the block really is pre-LN: with the
# same weights it must match `nn.TransformerEncoderLayer(norm_first=True)` (dropout off).

# %%
class ModernEncoderFixed(EncoderBlock):
    def forward(self, x, mask=None):
        # TODO: pre-LN: where do norm1 and norm2 go?
        x = self.norm1(x + self.self_attn(x, mask=mask))
        return self.norm2(x + self.ffn(x))


def self_check_pre_ln(cls, x=x):
    torch.manual_seed(8)
    block = cls(16, 4, 32, dropout=0.0, norm_first=True).eval()
    with torch.no_grad():
        for name, p in block.named_parameters():
            if name.startswith("norm"):
                p.add_(0.3 * torch.randn_like(p))
        got, want = block(x), to_torch_encoder(block)(x)
    ok = torch.allclose(got, want, atol=1e-5)
    print("✓ the block matches the pre-LN reference layer" if ok else
          f"✗ not yet: max difference from the pre-LN reference {(got - want).abs().max().item():.3f}")
    return ok


self_check_pre_ln(ModernEncoderFixed)

# %% jupyter={"source_hidden": true}
# Reference (collapsed; the encoder block is exercise 4, so here in words): each sublayer reads a
# normalised copy of the stream and adds its output to the un-normalised stream, `x + sublayer(norm(x))`;
# the stream itself is never normalised inside the block. The library's EncoderBlock passes:
assert self_check_pre_ln(EncoderBlock)

# %% [markdown]
# ## 7. The decoder block
#
# The decoder of an encoder–decoder Transformer (unit 06) has **three** sublayers:
#
# 1. **masked self-attention** over the target tokens generated so far: causal, so position $t$ only
#    sees positions $\le t$ (the mask arrives in `tgt_mask`, usually `causal_mask(T) & padding`);
# 2. **cross-attention**: the queries come from the decoder stream, the keys and values from the
#    encoder's output (`memory`, shape `(B, T_src, D)`). `T_src` may differ from the target length, so
#    the weights are `(B, H, T_tgt, T_src)`; only source padding is masked.
#    It is **not** causal: the whole source sentence is known;
# 3. the FFN.
#
# Pre-LN:
#
# ```
# x = x + self_attn(norm1(x), mask=…)             (each line with its residual dropout)
# x = x + cross_attn(norm2(x), memory, mask=…)
# x = x + ffn(norm3(x))
# ```
#
# `norm2` normalises the *queries* only. The memory was already normalised by the encoder stack's final
# norm; normalising it again is a bug (the grader names it if your decoder block does it).
#
# Parity with `nn.TransformerDecoderLayer` (whose cross-attention is called `multihead_attn`), both
# placements, with $T_{tgt} = 5 \ne T_{src} = 7$:

# %%
from llmcourse.nn.blocks import to_torch_decoder_layer, to_torch_encoder_layer  # noqa: E402

tgt, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
src_keep = torch.arange(7)[None, :] < torch.tensor([7, 4])[:, None]
cm = causal_mask(5)
for norm_first in (True, False):
    torch.manual_seed(9)
    dec = DecoderBlock(16, 4, 32, dropout=0.0, norm_first=norm_first).eval()
    ours = dec(tgt, memory, tgt_mask=cm, memory_mask=src_keep[:, None, None, :])
    ref = to_torch_decoder_layer(dec)(tgt, memory, tgt_mask=~cm, memory_key_padding_mask=~src_keep)
    err = (ours - ref).abs().max().item()
    print(f"{'pre-LN ' if norm_first else 'post-LN'} decoder: max |ours − nn.TransformerDecoderLayer| = {err:.2e}")
    assert err < 1e-5

# the encoder block's converter agrees with the one we wrote by hand above
enc_pf = EncoderBlock(16, 4, 32, dropout=0.0).eval()
assert torch.allclose(enc_pf(x), to_torch_encoder_layer(enc_pf)(x), atol=1e-5)

# %% [markdown]
# Three properties of a correct decoder block, each tested:
#
# * **causal over the target**: changing target positions $\ge p$ leaves outputs $< p$ unchanged;
# * **it listens to the encoder**: changing `memory` changes the output;
# * **source padding is invisible**: changing masked-out memory positions changes nothing.

# %%
torch.manual_seed(10)
dec = DecoderBlock(16, 4, 32, dropout=0.0).eval()
mm = src_keep[:, None, None, :]
base = dec(tgt, memory, tgt_mask=cm, memory_mask=mm)
tgt_future = tgt.clone()
tgt_future[:, 3:] += 5.0
mem_changed = memory + 1.0
mem_pad_changed = memory.clone()
mem_pad_changed[1, 4:] = -50.0
future_ok = torch.allclose(dec(tgt_future, memory, tgt_mask=cm, memory_mask=mm)[:, :3], base[:, :3], atol=1e-5)
listens = not torch.allclose(dec(tgt, mem_changed, tgt_mask=cm, memory_mask=mm), base, atol=1e-5)
pad_ok = torch.allclose(dec(tgt, mem_pad_changed, tgt_mask=cm, memory_mask=mm), base, atol=1e-5)
print(f"causal over the target: {future_ok}; depends on memory: {listens}; ignores source padding: {pad_ok}")
assert future_ok and listens and pad_ok

# %% [markdown]
# The shapes inside both blocks, for any sizes you choose:

# %% tags=["nbval-ignore-output"]
viz.show_block_diagram()

# %% [markdown]
# ## 8. The projection layer: logits, not probabilities
#
# The last piece maps the final hidden state `(B, T, D)` to one score per vocabulary entry,
# `(B, T, V)`: a single `nn.Linear(D, V)`, called `proj`. It returns **logits**. The loss
# (`F.cross_entropy`) applies `log_softmax` itself in a numerically stable way, and greedy decoding or
# sampling (unit 09) work on logits too. A projection that already applies a softmax makes the loss
# apply a second one: the loss is still a number, training still "runs", and the result is wrong.

# %%
torch.manual_seed(11)
proj = ProjectionLayer(16, 50)
h = torch.randn(2, 4, 16)
targets = torch.randint(0, 50, (2, 4))
logits = proj(h)
right = F.cross_entropy(logits.reshape(-1, 50), targets.reshape(-1))
double = F.cross_entropy(logits.softmax(-1).reshape(-1, 50), targets.reshape(-1))
print(f"logits shape {tuple(logits.shape)}; loss on logits {right:.4f}; loss after an extra softmax {double:.4f}")
print(f"(an extra softmax squeezes the loss towards log V = {math.log(50):.4f} whatever the model says)")
assert logits.shape == (2, 4, 50) and not torch.allclose(logits.exp().sum(-1), torch.ones(2, 4))
assert abs(double.item() - math.log(50)) < 0.05 and abs(right.item() - double.item()) > 0.01

# %% [markdown]
# ## 9. Parameters and compute of one block
#
# **Parameters**, with all biases, $D = 512$, $H = 8$, $d_{ff} = 2048$: attention
# $4D^2 + 4D$, FFN $2Dd_{ff} + d_{ff} + D$, each LayerNorm $2D$. They match PyTorch's layers.

# %%
def n_params(m):
    return sum(p.numel() for p in m.parameters())


enc512, dec512 = EncoderBlock(512, 8, 2048), DecoderBlock(512, 8, 2048)
attn = 4 * 512**2 + 4 * 512
ffn_count = 2 * 512 * 2048 + 2048 + 512
print(f"encoder block {n_params(enc512):,} (attention {attn:,}, FFN {ffn_count:,} = "
      f"{ffn_count / n_params(enc512):.1%}, norms {4 * 512:,})")
print(f"decoder block {n_params(dec512):,}")
assert n_params(enc512) == attn + ffn_count + 4 * 512 == 3_152_384 == n_params(nn.TransformerEncoderLayer(512, 8, 2048))
assert n_params(dec512) == 2 * attn + ffn_count + 6 * 512 == 4_204_032 == n_params(nn.TransformerDecoderLayer(512, 8, 2048))
assert abs(ffn_count / n_params(enc512) - 0.666) < 1e-3

# %% [markdown]
# **Compute.** Counting multiply–adds for one sequence of length $L$ (per layer):
#
# * the Q, K, V and output projections: $4 L D^2$;
# * the scores $QK^\top$ and the weighted sum of values: $2 L^2 D$ (quadratic in $L$);
# * the FFN: $2 L D\, d_{ff}$.
#
# The attention term overtakes the FFN when $2L^2D > 2LDd_{ff}$, that is when $L > d_{ff}$: 2,048 tokens
# for the base model. Below that, the FFN and the projections dominate; above it, the quadratic term
# does, which is why long-context work concentrates on attention.

# %%
for L in (128, 512, 2048, 4096):
    c = viz.block_cost(L, 512, 2048)
    print(f"L = {L:5d}: projections {c['projections'] / 1e9:6.2f} G, attention {c['attention'] / 1e9:6.2f} G, "
          f"FFN {c['ffn'] / 1e9:6.2f} G multiply-adds")
c_eq, c_above = viz.block_cost(2048, 512, 2048), viz.block_cost(2049, 512, 2048)
assert c_eq["attention"] == c_eq["ffn"] and c_above["attention"] > c_above["ffn"]
assert viz.block_cost(100, 512, 2048)["attention"] == 2 * 100**2 * 512

# %% [markdown]
# ## Summary
#
# * LayerNorm normalises each token over its features with the **biased** variance and $\varepsilon$
#   inside the root; it has no running statistics and behaves the same in `train()` and `eval()`.
# * Residual connections give the gradient an identity path: $\partial y/\partial x = I + \partial f/\partial x$.
# * The FFN is position-wise, $D \to d_{ff} \to D$, and holds two thirds of a block's parameters; exact
#   and tanh GELU differ by at most $4.74\times10^{-4}$.
# * Pre-LN ($x + f(\mathrm{LN}(x))$) trains stably and needs a final norm; post-LN
#   ($\mathrm{LN}(x + f(x))$) is the original and needs warmup.
# * The encoder block is self-attention + FFN; the decoder block adds cross-attention whose keys and
#   values come from the encoder memory. Both match PyTorch's layers with the same weights.
# * The model ends in a projection to **logits**.
#
# Next, unit 06 stacks these blocks into a full encoder–decoder Transformer and trains it to translate.

# %% [markdown]
# ## Extension (ungraded, open-ended): reading the residual stream
#
# In a pre-LN stack every sublayer only **adds** to the stream, so the final stream (before the final
# norm) is the input plus one contribution per sublayer. Write `contributions(blocks, x)`: for a list of
# pre-LN `EncoderBlock`s in `eval()` mode and no mask, return the list of the `2·len(blocks)` tensors that
# the attention and FFN sublayers add, in order (each block has `norm1`, `self_attn`, `norm2`, `ffn`).
# Then explore: which sublayers contribute most (by RMS) at initialisation, and why is there no such
# decomposition for a post-LN stack? The self-check verifies that the input plus your contributions
# rebuilds the stream (it prints "not attempted" while `contributions` is a stub).

# %%
def contributions(blocks, x):
    return None   # your code: a list of 2 * len(blocks) tensors shaped like x


def self_check_contributions():
    torch.manual_seed(12)
    blocks = [EncoderBlock(16, 4, 32, dropout=0.0, norm_first=True).eval() for _ in range(3)]
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        parts = contributions(blocks, x)
        h = x
        for blk in blocks:
            h = blk(h)
    if parts is None:
        print("not attempted (optional)")
        return
    ok = len(parts) == 6 and torch.allclose(x + sum(parts), h, atol=1e-5)
    print("✓ input + contributions = the stream" if ok else "✗ the contributions do not rebuild the stream")


self_check_contributions()
