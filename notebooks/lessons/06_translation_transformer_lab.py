# %% [markdown]
# # Unit 06 lab — training the course's tiny English→Hindi model
#
# **Expected time**: about 15–25 minutes on a 2-core laptop under the `laptop` profile (2,500 steps at
# batch 64); under `ci` a 20-step smoke run of the same code (well under a minute), which does not
# overwrite the shipped model.
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
# | training | 2,500 steps, batch 64, label smoothing 0.1, Adam(0.9, 0.98, 1e-9), Noam warmup 400, peak lr 1e-3 |
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
    train_translation,
    translate_tiny_path,
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
print(f"{sum(p.numel() for p in model.parameters()):,} parameters; vocabularies {en_tok.vocab_size} / {hi_tok.vocab_size}")

# %% [markdown]
# Training, with a progress bar. With live widgets (the `laptop` profile) the training monitor is redrawn at
# every evaluation, every 100 steps; under `ci` the final curves are shown after training.

# %% tags=["nbval-ignore-output"]
from IPython.display import display

monitor, redraw = viz.translation.make_training_monitor()
if monitor is not None:
    display(monitor)
factor = noam_factor_for_peak(recipe["peak_lr"], recipe["d_model"], recipe["warmup"])
history = train_translation(model, train_ids, recipe["steps"], recipe["batch_size"], recipe["max_len"],
                            recipe["warmup"], factor, recipe["label_smoothing"], val_ids,
                            eval_every=min(100, recipe["steps"]), seed=recipe["seed"], callback=redraw)
print(f"{recipe['steps']} steps in {history['seconds']:.0f} s; final validation loss {history['val_loss'][-1]:.3f}")

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
    h = shipped[1]["history"]
    best = min(range(len(h["val_loss"])), key=h["val_loss"].__getitem__)
    print(f"the shipped model recorded validation chrF {shipped[1]['val_chrf']:.1f} after {shipped[1]['recipe']['steps']} "
          f"steps; its validation loss was lowest ({h['val_loss'][best]:.2f}) at step {h['val_step'][best]} and "
          f"ended at {h['val_loss'][-1]:.2f}")

# %% [markdown]
# With fewer than 3,000 training pairs the model starts to **overfit** well before the end of the shipped
# run: the training loss keeps falling while the validation loss turns upwards (the checkpoint's history
# above shows where). A rising validation loss does not by itself mean worse greedy translations: the loss
# punishes over-confident probabilities on every token, while greedy decoding and chrF only use the most
# likely token. To choose the number of steps properly, track validation chrF during training and stop
# where it peaks (early stopping); more data or more dropout would also help.

# %%
if SAVE_ASSET and cfg["name"] != "ci":
    state = {k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    torch.save({"model": state, "config": model.config, "recipe": recipe, "val_chrf": score,
                "history": {k: v for k, v in history.items() if k != "seconds"}, "seconds": history["seconds"]},
               translate_tiny_path())
    print("wrote", translate_tiny_path())
