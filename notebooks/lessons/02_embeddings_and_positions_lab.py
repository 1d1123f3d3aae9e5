# %% [markdown]
# # Unit 02 lab — word vectors from context (skip-gram)
#
# The lesson of unit 02 says that a word is characterised by the words around it (the *distributional* idea:
# Harris, 1954; Firth, 1957), so vectors trained to predict a word's neighbours place words used in similar
# contexts (`he`/`she`, `day`/`night`) close together. Inside a transformer the embedding table is trained by the
# language-modelling loss instead, but the effect is similar. This lab shows it on real text. Nothing here is
# graded; the sizes come from the profile (`ci`: a smoke run; `laptop`: the full run, under a minute).

# %%
import collections
import math
import re
import time

import torch
import torch.nn.functional as F
from torch import nn

import llmcourse
from llmcourse.viz import figure
from llmcourse.viz.base import StaticPNG

cfg = llmcourse.setup_notebook("02")

# %% [markdown]
# We train a tiny **skip-gram model with negative sampling** (Mikolov et al., 2013) on Tiny Shakespeare, from
# scratch, in a few seconds. Each word has two vectors: `word_vecs` (the embedding we keep) and `ctx_vecs`
# (used only for training). For a (word, neighbour) pair within 2 positions, the score `word · neighbour`
# should be high; for 5 random "noise" words it should be low:
#
# $$\mathcal{L} = -\log\sigma(u_w\cdot v_c) - \sum_{n=1}^{5} \log\sigma(-u_w\cdot v_{n})$$
#
# First the data: lower-cased words, the most frequent `w2v_vocab` of them (the profile sets the sizes), and
# random dropping of very frequent words such as "the", which carry little context.

# %%
text = llmcourse.load_text("tinyshakespeare")
words = re.findall(r"[a-z]+(?:'[a-z]+)?", text.lower())
counts = collections.Counter(words)
vocab = [w for w, _ in counts.most_common(cfg["w2v_vocab"])]
stoi = {w: i for i, w in enumerate(vocab)}
corpus = torch.tensor([stoi[w] for w in words if w in stoi])

g = torch.Generator().manual_seed(cfg["seed"])
freq = torch.tensor([counts[w] for w in vocab], dtype=torch.float64)
share = freq / freq.sum()
keep_prob = ((1e-3 / share).sqrt() + 1e-3 / share).clamp(max=1.0).float()  # subsampling (Mikolov et al.)
corpus = corpus[torch.rand(len(corpus), generator=g) < keep_prob[corpus]]

window = 2  # (centre, context) pairs at offsets -2, -1, +1, +2
centres = torch.cat([corpus[window:-window]] * (2 * window))
contexts = torch.cat([corpus[window + o: len(corpus) - window + o] for o in range(-window, window + 1) if o != 0])
noise = (freq ** 0.75).float()
noise = noise / noise.sum()  # the usual noise distribution: unigram counts to the power 3/4
print(f"{len(words):,} words, vocabulary {len(vocab):,}, {len(corpus):,} kept after subsampling, "
      f"{len(centres):,} training pairs")

# %% tags=["nbval-ignore-output"]
V_w, D_w, K_neg = len(vocab), cfg["w2v_dim"], 5
word_vecs, ctx_vecs = nn.Embedding(V_w, D_w), nn.Embedding(V_w, D_w)
nn.init.uniform_(word_vecs.weight, -0.5 / D_w, 0.5 / D_w)
nn.init.zeros_(ctx_vecs.weight)
opt = torch.optim.Adam([*word_vecs.parameters(), *ctx_vecs.parameters()], lr=cfg["w2v_lr"])

threads = torch.get_num_threads()
torch.set_num_threads(1)  # these ops are tiny: one thread avoids the cost of synchronising two
start = time.perf_counter()
try:
    for step in range(cfg["w2v_steps"]):
        j = torch.randint(0, len(centres), (cfg["w2v_batch"],), generator=g)
        u = word_vecs(centres[j])                                                       # (B, D)
        negatives = torch.multinomial(noise, len(j) * K_neg, replacement=True, generator=g).view(-1, K_neg)
        pos_score = (u * ctx_vecs(contexts[j])).sum(-1)                                 # (B,)
        neg_score = torch.einsum("bd,bkd->bk", u, ctx_vecs(negatives))                   # (B, K)
        loss = -(F.logsigmoid(pos_score) + F.logsigmoid(-neg_score).sum(-1)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % max(1, cfg["w2v_steps"] // 4) == 0 or step == cfg["w2v_steps"] - 1:
            print(f"step {step:5d}  loss {loss.item():.3f}")
finally:
    torch.set_num_threads(threads)
print(f"trained {cfg['w2v_steps']} steps in {time.perf_counter() - start:.1f} s")
print(f"loss with all scores 0: (1 + {K_neg})·log 2 = {(1 + K_neg) * math.log(2):.2f}")

# %% [markdown]
# The loss started near `(1 + K)·log 2` (all scores 0; the last line above). Now look at the **nearest neighbours** by cosine
# similarity. Nobody told the model that "thou" is a pronoun or that Romeo and Juliet belong together; it only
# saw which words occur near which.

# %% tags=["nbval-ignore-output"]
unit_vecs = F.normalize(word_vecs.weight.detach(), dim=-1)


def neighbours(word, n=6):
    sims = unit_vecs @ unit_vecs[stoi[word]]
    return [vocab[i] for i in sims.topk(n + 1).indices[1:].tolist()]


for w in ["thou", "he", "king", "romeo", "day", "father"]:
    print(f"{w:>7}: {', '.join(neighbours(w))}")

# %% [markdown]
# A number we can check: the cosine similarity of related pairs against that of random pairs of words.

# %%
pairs = [("he", "she"), ("king", "queen"), ("thou", "thee"), ("day", "night"), ("romeo", "juliet"),
         ("brother", "sister"), ("son", "daughter"), ("his", "her")]
pair_sims = torch.stack([unit_vecs[stoi[a]] @ unit_vecs[stoi[b]] for a, b in pairs])
r = torch.randint(0, V_w, (2, 2000), generator=torch.Generator().manual_seed(1))
random_sims = (unit_vecs[r[0]] * unit_vecs[r[1]]).sum(-1)
print("related pairs:", {f"{a}/{b}": round(s, 2) for (a, b), s in zip(pairs, pair_sims.tolist())})
print(f"mean cosine: related pairs {pair_sims.mean():.2f}, random pairs {random_sims.mean():.2f} "
      f"(one-hot vectors: 0 for every pair)")
assert pair_sims.mean() > random_sims.mean() + 0.1, "trained vectors should place related words closer"

# %% [markdown]
# A 2-D picture: project the vectors of a few groups of words onto their two principal directions
# (PCA). Two dimensions lose most of the information, so do not over-read it; groups that share contexts
# still tend to sit together.

# %% tags=["nbval-ignore-output"]
groups = {
    "pronouns": ["he", "she", "him", "her", "thou", "thee", "you", "we"],
    "rank": ["king", "queen", "prince", "duke", "lord", "lady"],
    "family": ["father", "mother", "son", "daughter", "brother", "sister"],
    "time": ["day", "night", "hour", "morning", "year", "time"],
    "numbers": ["one", "two", "three", "four", "ten", "hundred"],
}
chosen = [(w, name) for name, ws in groups.items() for w in ws if w in stoi]
vecs = unit_vecs[[stoi[w] for w, _ in chosen]]
centred = vecs - vecs.mean(0)
_, _, v_right = torch.linalg.svd(centred, full_matrices=False)
xy = centred @ v_right[:2].T
fig, ax = figure(figsize=(7, 5))
colours = dict(zip(groups, ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]))
for (w, name), (x, y) in zip(chosen, xy.tolist()):
    ax.scatter(x, y, color=colours[name], s=25)
    ax.annotate(w, (x, y), fontsize=9, color=colours[name], xytext=(3, 3), textcoords="offset points")
for name, c in colours.items():
    ax.scatter([], [], color=c, label=name)
ax.legend(fontsize=8)
ax.set_title("Skip-gram vectors trained on Tiny Shakespeare, projected to 2-D (PCA)", fontsize=10)
StaticPNG(fig)

# %% [markdown]
# ## Open-ended extension (ungraded)
#
# Analogies: with good vectors, `king − man + woman` lands near `queen`. Try a few analogies with
# `unit_vecs` (remember to exclude the three input words from the answer), then change `window`, `K_neg` or
# `w2v_dim` in the profile and see which settings help. With a corpus this small, expect most analogies to fail:
# what does that say about how much text such regularities need?
