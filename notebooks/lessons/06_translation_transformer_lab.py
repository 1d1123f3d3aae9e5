# %% [markdown]
# # Unit 06 lab — training the course's tiny English→Hindi model
#
# **Expected time**: about 10–25 minutes on a 2-core laptop under the `laptop` profile (at most 2,500 steps
# at batch 64, early-stopped on the validation loss); under `ci` a 20-step smoke run of the same code (well
# under a minute), which does not overwrite the shipped model.
#
# This companion to `06_translation_transformer.ipynb` runs the full recipe that produced
# `assets/translate_tiny.pt`, the model the lesson uses in its last sections and the grader uses to check
# `greedy_translate`:
#
# | setting | value |
# |---|---|
# | data | Tatoeba EN–HI, seed-0 split, training part only |
# | tokenizers | unit 01 BPE, 2,000 merges per language (`assets/tokenizers/`) |
# | model | `Transformer(D=128, H=4, d_ff=512, 2 + 2 layers, max_len=32, dropout=0.1)` |
# | training | at most 2,500 steps, batch 64, label smoothing 0.1, Adam(0.9, 0.98, 1e-9), Noam warmup 400, peak lr 1e-3 |
# | early stopping | validation loss every 100 steps; keep the best weights; stop after 5 evaluations without improvement |
# | seed | `torch.manual_seed(0)` before building the model; batches from `Generator().manual_seed(0)` |
#
# The same recipe is available as a script: `python -m llmcourse.train.seq2seq`. Set `SAVE_ASSET = True`
# below to overwrite the shipped file with your own run. Results vary slightly with the number of threads
# and the PyTorch build, so your chrF may differ from the recorded one by a point or so.

# %%
import torch

import llmcourse
from llmcourse import viz
from llmcourse.data.translation import (
    encode_pairs,
    load_tatoeba_tokenizers,
    load_translation_pairs,
    split_pairs,
)
from llmcourse.models.transformer import Transformer
from llmcourse.train.seq2seq import (
    TRANSLATE_TINY_RECIPE,
    evaluate_chrf,
    load_translate_tiny,
    noam_factor_for_peak,
    save_translate_tiny,
    train_translation,
)

cfg = llmcourse.setup_notebook("06")
recipe = dict(TRANSLATE_TINY_RECIPE)
if cfg["name"] == "ci":
    recipe.update(steps=20, warmup=5)           # smoke run: the same code path, a few seconds per ten steps
SAVE_ASSET = False
print(recipe)

# %%
en_tok, hi_tok = load_tatoeba_tokenizers(recipe["num_merges"])
train, val, test = split_pairs(load_translation_pairs())
train_ids, val_ids = encode_pairs(train, en_tok, hi_tok), encode_pairs(val, en_tok, hi_tok)
torch.manual_seed(recipe["seed"])
model = Transformer(en_tok.vocab_size, hi_tok.vocab_size, recipe["d_model"], recipe["num_heads"], recipe["d_ff"],
                    recipe["n_enc"], recipe["n_dec"], recipe["max_len"], recipe["dropout"])
print(f"{sum(p.numel() for p in model.parameters()):,} parameters; vocabularies {en_tok.vocab_size} / {hi_tok.vocab_size}; "
      f"{len(train):,} training pairs, {len(val):,} validation, {len(test):,} test")

# %% [markdown]
# Training, with a progress bar. With live widgets (the `laptop` profile) the training monitor is redrawn at
# every evaluation, every 100 steps; under `ci` the final curves are shown after training.
#
# **Early stopping.** With the few thousand training pairs counted above, the model starts to **overfit**
# long before the step cap: the training loss keeps falling while the validation loss turns upwards.
# `train_translation(..., patience=5)` measures the validation loss at every evaluation, keeps a copy of the
# weights whenever it reaches a new minimum, stops after 5 evaluations in a row without one, and loads the best
# weights back. The validation split is what chooses the step, so its scores are slightly optimistic: the
# **test** split, used once at the end, is the honest number.

# %% tags=["nbval-ignore-output"]
from IPython.display import display

monitor, redraw = viz.translation.make_training_monitor()
if monitor is not None:
    display(monitor)
factor = noam_factor_for_peak(recipe["peak_lr"], recipe["d_model"], recipe["warmup"])
history = train_translation(model, train_ids, recipe["steps"], recipe["batch_size"], recipe["max_len"],
                            recipe["warmup"], factor, recipe["label_smoothing"], val_ids,
                            eval_every=min(recipe["eval_every"], recipe["steps"]), seed=recipe["seed"],
                            callback=redraw, patience=recipe["patience"])
print(f"{history['stopped_step']} of at most {recipe['steps']} steps in {history['seconds']:.0f} s; kept the weights "
      f"of step {history['best_step']} (validation loss {history['best_val_loss']:.3f})")

# %%
assert history["val_loss"][-1] < history["val_loss"][0] or len(history["val_loss"]) == 1
score, hyps = evaluate_chrf(model, val, en_tok, hi_tok, recipe["max_len"])
print(f"validation chrF ({len(val)} sentences): {score:.1f}")
for p, h in list(zip(val, hyps))[:10]:
    print(f"{p.en!r}\n   reference: {p.hi}   [{p.attribution}]\n   model    : {h}")

# %% tags=["nbval-ignore-output"]
viz.show_training_monitor(history, score)

# %% [markdown]
# The held-out **test** split is kept for a final score: evaluate it once, at the end, never while tuning.

# %%
test_score, _ = evaluate_chrf(model, test, en_tok, hi_tok, recipe["max_len"])
print(f"test chrF ({len(test)} sentences): {test_score:.1f}")
shipped = load_translate_tiny()
if shipped is not None:
    ck = shipped[1]
    print(f"the shipped model: weights of step {ck['best_step']} (lowest validation loss, {ck['best_val_loss']:.3f}); "
          f"training stopped at step {ck['stopped_step']} of at most {ck['recipe']['steps']}; validation chrF "
          f"{ck['val_chrf']:.1f}")

# %% [markdown]
# The shipped model's history (printed above) shows the same pattern: the validation loss reaches its minimum
# and then rises while the training loss keeps falling. A rising validation loss does not by itself mean worse
# greedy translations: the loss punishes over-confident probabilities on every token, while greedy decoding and
# chrF only use the most likely token. Stopping on validation chrF instead (it costs a decoding pass per
# evaluation) can pick a later step; more data or more dropout would also help.

# %%
if SAVE_ASSET and cfg["name"] != "ci":
    print("wrote", save_translate_tiny(model, history, recipe, score))
