# %% [markdown]
# # Unit 03 lab — training a one-layer attention language model
#
# The lesson built attention from nothing on six made-up vectors. Here attention **learns**: we train the
# smallest language model that has attention in it on Shakespeare, look at the weights of its one head on
# text it never saw, and finish with an open-ended extension. The attention layer is the library's
# `CausalSelfAttention` (the one you write in the exercises). Sizes come from `course.toml`: about a
# minute on a laptop CPU, a few seconds under the `ci` profile.

# %%
import math
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import llmcourse
from llmcourse.viz import attention as viz

cfg = llmcourse.setup_notebook("03")
cfg

# %% [markdown]
# ## Training a one-layer attention language model
#
# The lesson used made-up vectors. Now let attention **learn**. We build the smallest language
# model that has attention in it:
#
# $$x_t = \mathrm{tok\_emb}(\mathrm{id}_t) + \mathrm{pos\_emb}(t),\qquad h = x + \mathrm{CausalSelfAttention}(x),\qquad \mathrm{logits} = h\,W_{out} + b.$$
#
# It lives in the library as `llmcourse.models.AttentionOnlyLM`. The `x +` is a **residual connection**
# (unit 05 explains them): the current token's own embedding reaches the output directly, so attention
# is free to look at *earlier* tokens. There is no feed-forward layer, no LayerNorm and a single head;
# units 04–05 add those.
#
# **Characters, not GPT-2 tokens.** We model text one character at a time (65 distinct characters in
# tinyshakespeare). With GPT-2's 50,257-token vocabulary the embedding table and the output layer
# would have 50,257 rows each, hundreds of times more parameters than the attention itself, and almost
# all the compute would go into the final softmax. With 65 characters, the attention layer is a real
# share of the model and training takes about a minute on a laptop CPU (a few seconds under the `ci`
# profile; the sizes come from `course.toml`).
#
# The data: the first 90 % of the characters for training, the last 10 % for validation. Each training
# example is a random window of `context_length` characters; the targets are the same window shifted by
# one, so every position is a prediction of the next character.

# %%
from tqdm.auto import tqdm  # noqa: E402

from llmcourse.models.attention_lm import AttentionOnlyLM  # noqa: E402

text = llmcourse.load_text("tinyshakespeare")
chars = sorted(set(text))
stoi = {ch: i for i, ch in enumerate(chars)}
itos = dict(enumerate(chars))
data = torch.tensor([stoi[ch] for ch in text], dtype=torch.long)
n_train = int(0.9 * len(data))
train_data, val_data = data[:n_train], data[n_train:]
print(f"{len(text):,} characters, {len(chars)} distinct; train {len(train_data):,}, val {len(val_data):,}")
assert len(text) == 1_115_394 and len(chars) == 65

T_ctx, B, D = cfg["context_length"], cfg["batch_size"], cfg["d_model"]
batch_gen = torch.Generator().manual_seed(cfg["seed"])


def get_batch(split):
    """B random windows of T_ctx characters (inputs) and the same windows shifted by one (targets)."""
    source = train_data if split == "train" else val_data
    starts = torch.randint(0, len(source) - T_ctx, (B,), generator=batch_gen)
    x = torch.stack([source[s:s + T_ctx] for s in starts])
    y = torch.stack([source[s + 1:s + T_ctx + 1] for s in starts])
    return x.to(device), y.to(device)


device = cfg["device"]   # "cpu", or "cuda" under the gpu profile when a GPU is present
torch.manual_seed(cfg["seed"])
model = AttentionOnlyLM(vocab_size=len(chars), d_model=D, context_length=T_ctx, dropout=0.0).to(device)
n_params = sum(p.numel() for p in model.parameters())
n_attn = sum(p.numel() for p in model.attn.parameters())
print(f"profile {cfg['name']}: context {T_ctx}, batch {B}, d_model {D}, {cfg['train_steps']} steps")
print(f"{n_params:,} parameters, {n_attn:,} of them in the attention layer")
assert n_params == 2 * len(chars) * D + T_ctx * D + 3 * D * D + len(chars)


@torch.no_grad()
def estimate_loss(n_batches=cfg.get("eval_batches", 5)):
    model.eval()
    result = {split: sum(F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
                         for x, y in (get_batch(split) for _ in range(n_batches))) / n_batches
              for split in ("train", "val")}
    model.train()
    return result


initial = estimate_loss()
print(f"before training: val loss {initial['val']:.3f}; a uniform guess would give ln 65 = {math.log(65):.3f}")

# %% [markdown]
# The training loop is the standard one: forward, cross-entropy between the logits and the next
# characters, backward, an AdamW step. Every `eval_every` steps we estimate the loss on a few training
# and validation batches.

# %% tags=["nbval-ignore-output"]
optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.get("lr", 3e-3))
history = {"step": [], "train": [], "val": []}
t0 = time.perf_counter()
model.train()
for step in tqdm(range(cfg["train_steps"] + 1), desc="training"):
    if step % cfg["eval_every"] == 0 or step == cfg["train_steps"]:
        losses = estimate_loss()
        history["step"].append(step)
        history["train"].append(losses["train"])
        history["val"].append(losses["val"])
    if step == cfg["train_steps"]:
        break
    x, y = get_batch("train")
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
elapsed = time.perf_counter() - t0
print(f"{cfg['train_steps']} steps in {elapsed:.1f} s; final train loss {history['train'][-1]:.3f}, "
      f"val loss {history['val'][-1]:.3f}")

# %% tags=["nbval-ignore-output"]
assert history["val"][-1] < initial["val"], "training should lower the validation loss"

# Two baselines that ignore context: character frequencies (unigram), and "previous character only" (bigram)
counts = torch.bincount(train_data, minlength=len(chars)).float() + 1
unigram_loss = float(-torch.log(counts / counts.sum())[val_data].mean())
pair_counts = torch.ones(len(chars), len(chars))
pair_counts.index_put_((train_data[:-1], train_data[1:]), torch.ones(len(train_data) - 1), accumulate=True)
bigram_logp = torch.log(pair_counts / pair_counts.sum(-1, keepdim=True))
bigram_loss = float(-bigram_logp[val_data[:-1], val_data[1:]].mean())
print(f"unigram baseline {unigram_loss:.3f}, bigram baseline {bigram_loss:.3f}, "
      f"our model {history['val'][-1]:.3f} (validation cross-entropy, nats per character)")

fig, ax = plt.subplots(figsize=(6.5, 3.6))
ax.plot(history["step"], history["train"], "o-", label="train")
ax.plot(history["step"], history["val"], "o-", label="validation")
ax.axhline(bigram_loss, color="gray", ls="--", lw=1, label="bigram baseline")
ax.axhline(math.log(len(chars)), color="gray", ls=":", lw=1, label="uniform guess (ln 65)")
ax.set_xlabel("step")
ax.set_ylabel("cross-entropy (nats/char)")
ax.set_title(f"one-layer attention-only LM, profile '{cfg['name']}'")
ax.legend()
plt.show()

# %% [markdown]
# With the `laptop` profile the validation loss ends below the bigram baseline: the model predicts better
# than any rule that looks only at the previous character, so its attention must be using the characters
# further back. (Under `ci` the run is far too short for that; it only checks that the code works.)
#
# **What did the attention learn?** Feed a line from the *validation* text (never seen in training) and
# plot `model.attn.last_weights`, the weights of the last forward pass.

# %% tags=["nbval-ignore-output"]
line = "BAPTISTA:\nGood morrow, neighbour Gremio."[:T_ctx]
assert line in text[n_train:]
ids_line = torch.tensor([[stoi[ch] for ch in line]], device=device)
model.eval()
with torch.no_grad():
    model(ids_line)
w_line = model.attn.last_weights[0].cpu()
assert torch.allclose(w_line.sum(-1), torch.ones(len(line)), atol=1e-5) and (w_line.triu(1) == 0).all()

# how far back does a typical query look? average weight at each distance (0 = itself)
by_distance = [float(w_line.diagonal(-d).mean()) for d in range(min(6, len(line)))]
print("mean weight at distance 0, 1, 2, ...:", [round(v, 3) for v in by_distance])
print("on average the head puts most weight at distance", max(range(len(by_distance)), key=by_distance.__getitem__))

# %% tags=["nbval-ignore-output"]
viz.attention_heatmap(w_line, list(line), title=f"trained attention on a validation line (profile '{cfg['name']}')",
                      figsize=(8.5, 7.5))

# %% [markdown]
# Each row is one character predicting the next. After the `laptop` run the head has become a
# **previous-character detector**: most rows put most of their weight one step below the diagonal, and
# distance 1 gets the largest mean weight (printed above). That makes sense for this architecture: the
# residual path already delivers the *current* character to the output layer, so the most useful thing a
# single head can add is the character before it. Together they predict from the last two characters, a
# trigram-like rule, which is why the model beats the bigram baseline. With more layers, heads can build on
# each other (unit 04 and later). Under `ci` the picture is still mostly noise.

# %% [markdown]
# The same trained head on another real sentence, the first line of the bundled story *The Verdict*, now
# with the lesson's controls (the $\sqrt{d_k}$ scale of section 5, the causal mask of section 8). One row per character (`␣` marks a space); the queries and keys
# are the trained model's own, its `W_query` and `W_key` applied to the token plus position embeddings,
# so the default setting (scaled, causal, temperature 1) is exactly what the model computes (checked
# below). Then watch what the controls do to a *learned* pattern: without the $\sqrt{d_k}$ scale the
# rows collapse further onto their largest key; without the mask the upper triangle fills in with weights
# the model never learned to use; the temperature sharpens or flattens every row.

# %%
verdict_line = llmcourse.load_text("the-verdict").split("\n", 1)[0][:T_ctx]
ids_v = torch.tensor([[stoi.get(ch, stoi[" "]) for ch in verdict_line]], device=device)
with torch.no_grad():
    x_v = model.tok_emb(ids_v) + model.pos_emb(torch.arange(ids_v.shape[1], device=device))
    q_v, k_v = model.attn.W_query(x_v)[0].cpu(), model.attn.W_key(x_v)[0].cpu()
    model(ids_v)
w_v = viz.attention_map(q_v, k_v, scale=True, causal=True)
assert torch.allclose(w_v, model.attn.last_weights[0].cpu(), atol=1e-5)   # the widget shows the model's weights
for scale_on in (True, False):
    top = viz.attention_map(q_v, k_v, scale=scale_on, causal=True)[1:].max(dim=-1).values.mean()
    print(f"scale={scale_on!s:5}: mean largest weight per row (rows 1..) = {top:.2f}")

# %% tags=["nbval-ignore-output"]
viz.show_sentence_attention(q=q_v, k=k_v, tokens=list(verdict_line), unit="characters")

# %% [markdown]
# Finally, let the model write. It samples one character at a time from its own predictions (unit 09
# builds proper sampling with temperature, top-k and top-p). Expect word-shaped gibberish with
# Shakespearean punctuation, not Shakespeare: one attention layer is a small model.

# %% tags=["nbval-ignore-output"]
prompt = "ROMEO:\n"
start = torch.tensor([[stoi[ch] for ch in prompt]], device=device)
sample_ids = model.generate(start, max_new_tokens=cfg.get("sample_chars", 300),
                            generator=torch.Generator(device=device).manual_seed(0))
print("".join(itos[int(i)] for i in sample_ids[0]))

# %% [markdown]
# ## Extension (ungraded, open-ended): a second attention layer
#
# The one-layer model above mostly looks one character back, because that is all a single head on top of
# the residual path can usefully add. What does a **second** attention layer learn? Build a model with two
# `CausalSelfAttention` layers, each with its own residual connection (`h = h + attn_l(h)`), train it with
# the training loop above, and compare: the validation loss, and the mean weight at each distance for each
# layer. Does a layer-2 head learn to look further back, or to find the previous occurrence of the current
# character? There is no single right answer; the self-check only verifies that your model is a causal
# language model with the right output shape (it prints "not attempted" while `two_layer_model` is `None`).

# %%
two_layer_model = None   # your model here: maps (B, T) character ids to (B, T, 65) logits


def self_check_extension(m):
    if m is None:
        print("not attempted (optional)")
        return
    ids = torch.randint(0, len(chars), (2, T_ctx), generator=torch.Generator().manual_seed(0)).to(device)
    changed = ids.clone()
    changed[:, T_ctx // 2:] = (changed[:, T_ctx // 2:] + 1) % len(chars)
    m.eval()
    with torch.no_grad():
        out, out2 = m(ids), m(changed)
    causal = torch.allclose(out[:, :T_ctx // 2], out2[:, :T_ctx // 2], atol=1e-5)
    shape_ok = tuple(out.shape) == (2, T_ctx, len(chars))
    print(f"output shape {tuple(out.shape)} {'✓' if shape_ok else '✗'}; causal {'✓' if causal else '✗ (the future leaks)'}")


self_check_extension(two_layer_model)
