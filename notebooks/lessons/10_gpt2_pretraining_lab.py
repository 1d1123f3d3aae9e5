# %% [markdown]
# # Unit 10 lab — TinyStories with GPT-2's tokenizer
#
# **Expected time**: about 15–20 minutes on an idle 2-core laptop under the `laptop` profile (3,000
# steps); under `ci` a 20-step smoke run of the same code (well under a minute).
#
# The lesson trained on characters. Real language models read **subword tokens**. This lab keeps the
# model's size (D = 128, 4 heads, 4 layers, context 128) and changes the data: about 1,100 short
# children's stories from TinyStories (Eldan & Li, 2023), tokenized with GPT-2's byte-level BPE.
#
# Two things change with the tokenizer:
#
# * **the vocabulary**: GPT-2 has 50,257 tokens, and a `50,257 × 128` embedding alone would be eight
#   times our whole character model, mostly rows no story ever uses. As in unit 07 we **compact** it:
#   the GPT-2 ids that occur in the training stories are renumbered 4, 5, … (ids 0–3 are reserved; an id
#   never seen in training maps to 3, `[UNK]`);
# * **what a loss means**: a token is about four characters, so nats per token and nats per character
#   are different units (we convert at the end).
#
# The pipeline is the lesson's, with two batched maps: the file is one document row; the first map
# splits it into stories (more output rows than input rows), repairing a few mis-decoded quotes; the
# second appends `<|endoftext|>` to each story and encodes it with GPT-2's BPE. Both results are cached
# as Arrow files in the user cache.

# %%
import math

import torch
from IPython.display import display

import llmcourse
from llmcourse.data import corpus as C
from llmcourse.data import data_path
from llmcourse.models.gpt2 import GPT2Config, GPT2Model
from llmcourse.train import pretraining as P
from llmcourse.train.losses import perplexity
from llmcourse.viz import pretraining as viz

cfg = llmcourse.setup_notebook("10")
STEPS, B, T = cfg["lab_steps"], cfg["lab_batch_size"], cfg["lab_context_length"]
print({k: cfg[k] for k in cfg if k.startswith("lab_")})

# %% [markdown]
# ## The stories

# %%
raw = data_path("tinystories-sample").read_text(encoding="utf-8")
stories = C.split_stories(raw)
print(f"{len(raw):,} characters; {len(stories):,} stories; mis-decoded quote sequences before repair: "
      f"{raw.count('â€')}, after: {sum(s.count('â€') for s in stories)}")
print(stories[0][:300], "…")

# %%
ts = C.tinystories_corpus()
tok = ts.tokenizer
n_chars = sum(len(s) + 1 for s in stories)
print(ts.dataset)
print(f"{ts.n_tokens:,} GPT-2 tokens ({n_chars / ts.n_tokens:.2f} characters per token); "
      f"train {ts.train.numel():,}, validation {ts.val.numel():,}")
print(f"compact vocabulary: {len(tok.vocab):,} GPT-2 ids + 4 reserved = {tok.vocab_size:,} (of {tok.enc.n_vocab:,}); "
      f"validation tokens unseen in training: {(ts.val == tok.UNK).float().mean():.2%}")
assert int((ts.train == tok.eot_id).sum() + (ts.val == tok.eot_id).sum()) == len(stories)

# %% [markdown]
# **A small sample, seen many times.** The file is a sample, not the corpus (the full TinyStories has
# about two million stories). A run of `lab_steps` steps of `B × T` tokens therefore passes over the same
# training stories again and again; how often, for this profile:

# %%
sample_mb = data_path("tinystories-sample").stat().st_size / 1e6
planned_passes = STEPS * B * T / ts.train.numel()
print(f"sample {sample_mb:.2f} MB; {STEPS:,} steps × {B} × {T} = {STEPS * B * T:,} tokens = "
      f"{planned_passes:.1f} passes over the {ts.train.numel():,} training tokens")

# %% [markdown]
# The parameter count of the same architecture with the full and the compact vocabulary (the output
# head is tied to the embedding, so the vocabulary costs `V × D` once):

# %%
def lab_config(vocab_size):
    return GPT2Config(vocab_size=vocab_size, context_length=T, d_model=128, n_heads=4, n_layers=4,
                      dropout=cfg["lab_dropout"])


with torch.device("meta"):
    full = sum(p.numel() for p in GPT2Model(lab_config(50_257)).parameters())
    compact = sum(p.numel() for p in GPT2Model(lab_config(tok.vocab_size)).parameters())
print(f"full GPT-2 vocabulary: {full:,} parameters; compact: {compact:,} ({compact / full:.0%})")

# %% [markdown]
# ## Training
#
# The lesson's loop and settings; dropout is on (`lab_dropout`) because a story corpus this small is
# seen many times. The dashboard redraws during the run under live widgets.

# %%
torch.manual_seed(cfg["seed"])
model = GPT2Model(lab_config(tok.vocab_size))
prompt = "Once upon a time"


def sample_now(m):
    return P.sample_text(m, tok, prompt, cfg["lab_sample_tokens"], temperature=0.8, seed=0)


dashboard, redraw = viz.make_training_dashboard(STEPS, tok.vocab_size)
if dashboard is not None:
    display(dashboard)

# %% tags=["nbval-ignore-output"]
hist = P.pretrain(model, ts.train, ts.val, steps=STEPS, batch_size=B, context_length=T, max_lr=cfg["max_lr"],
                  min_lr=cfg["min_lr"], warmup_steps=cfg["lab_warmup_steps"], weight_decay=cfg["weight_decay"],
                  max_norm=cfg["max_norm"], seed=cfg["seed"], eval_every=cfg["lab_eval_every"],
                  eval_batches=cfg["lab_eval_batches"], sample_fn=sample_now, callback=redraw,
                  callback_every=cfg["dashboard_every"], device=cfg["device"])
print(f"{hist['seconds'] / 60:.1f} min of training, {hist['ms_per_step']:.0f} ms/step")

# %% tags=["nbval-ignore-output"]
viz.show_training_dashboard(hist, tok.vocab_size)

# %% [markdown]
# ## Results
#
# Losses per **token**; dividing by the characters per token gives nats per character, the unit of the
# lesson's character model (roughly comparable, although the two corpora differ).

# %%
val = hist["val_loss"][-1]
chars_per_token = n_chars / ts.n_tokens
print(f"initial validation loss {hist['val_loss'][0]:.3f} (ln V = {math.log(tok.vocab_size):.3f})")
print(f"final validation loss {val:.3f} nats/token (perplexity {perplexity(val):.1f}); "
      f"{val / chars_per_token:.3f} nats/character")
print(f"training loss on the fixed batches {hist['train_loss_eval'][-1]:.3f}: gap {val - hist['train_loss_eval'][-1]:+.3f}")
passes = STEPS * B * T / ts.train.numel()
print(f"{STEPS * B * T:,} tokens seen = {passes:.1f} passes over the training stories")
assert abs(hist["val_loss"][0] - math.log(tok.vocab_size)) < 0.3 and val < hist["val_loss"][0]

# %%
for step, text in hist["samples"]:
    print(f"--- after {step} steps\n{prompt}{text}")

# %% [markdown]
# ## What the repetition costs: the train/validation gap
#
# Every evaluation scored the same fixed batches of training and of validation stories. Next to the
# number of passes made so far, the gap `validation − training` shows what repetition does: while the
# model is learning what stories have in common both losses fall together; once it has seen each
# training story many times it starts to learn *those* stories, the training loss keeps falling and the
# validation loss stalls or rises. (Under the `ci` profile the run is far too short for that: it stops
# after a fraction of one pass, and the gap is noise.)

# %%
rows = [(s, s * B * T / ts.train.numel(), tr, va) for s, tr, va in
        zip(hist["eval_step"], hist["train_loss_eval"], hist["val_loss"])]
print(f"{'step':>6} {'passes':>7} {'train':>7} {'valid':>7} {'gap':>7}")
for s, p, tr, va in rows:
    print(f"{s:6d} {p:7.2f} {tr:7.3f} {va:7.3f} {va - tr:+7.3f}")
best = min(rows, key=lambda r: r[3])
final_gap, best_gap = rows[-1][3] - rows[-1][2], best[3] - best[2]
print(f"lowest validation loss {best[3]:.3f} after {best[0]:,} steps ({best[1]:.1f} passes, gap {best_gap:+.3f}); "
      f"at the end {rows[-1][3]:.3f} (gap {final_gap:+.3f})")
print("the last evaluation is the best one: more steps still helped" if best is rows[-1] else
      f"the validation loss rose by {rows[-1][3] - best[3]:.3f} after its lowest point: the extra passes memorised")
assert best[3] <= rows[-1][3] and rows[-1][1] == STEPS * B * T / ts.train.numel()

# %% [markdown]
# A widening gap is the sample's size speaking, not the model's: the cure is more data (a larger part of
# TinyStories), or, with this sample, fewer steps (stop near the lowest validation loss), more dropout or
# weight decay, or a smaller model. Try one: set `lab_steps` to the step of the lowest validation loss and
# compare the samples.
