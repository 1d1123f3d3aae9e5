"""Unit 10 (pretraining): the datasets pipeline, batches, loss, schedule, clipping, optimizer groups,
checkpoints, the resumable loop, the shipped character model and the widgets.

Reference numbers come from independent routes: the raw file, ``F.cross_entropy`` on flattened logits,
``torch.nn.utils.clip_grad_norm_``, the closed-form schedule, hand-cut windows, and AdamW's decay read
off the weights.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

from llmcourse.data import corpus as C
from llmcourse.data import data_path
from llmcourse.models.gpt2 import GPT2Config, GPT2Model
from llmcourse.train import checkpoints as K
from llmcourse.train import optim as O
from llmcourse.train import pretraining as P
from llmcourse.train.losses import lm_loss, perplexity
from llmcourse.train.schedules import warmup_cosine_lr


@pytest.fixture(scope="module")
def shakespeare():
    return C.char_corpus("tinyshakespeare")


def tiny_gpt(dropout=0.0, seed=0, vocab=13, context=16):
    torch.manual_seed(seed)
    return GPT2Model(GPT2Config(vocab_size=vocab, context_length=context, d_model=16, n_heads=2, n_layers=2,
                                dropout=dropout))


# ---------------------------------------------------------------- the datasets pipeline


def test_tinyshakespeare_through_datasets(shakespeare):
    raw = data_path("tinyshakespeare").read_text(encoding="utf-8")
    assert shakespeare.n_chars == len(raw) == 1_115_394
    assert shakespeare.train.numel() == 1_003_854 and shakespeare.val.numel() == 111_540
    assert shakespeare.vocab_size == 65 and shakespeare.tokenizer.chars[0] == "\n"
    ids = torch.cat([shakespeare.train, shakespeare.val])
    assert ids.dtype == torch.long
    assert shakespeare.tokenizer.decode(ids.tolist()) == raw            # nothing lost, "\n" included
    assert int((ids == 0).sum()) == raw.count("\n") == 40_000
    assert len(shakespeare.dataset) == 1                                # one document row


def test_line_mode_would_drop_newlines():
    import datasets

    lines = datasets.load_dataset("text", data_files=str(data_path("tinyshakespeare")), split="train",
                                  cache_dir=str(C.hf_cache_dir()))
    assert len(lines) == 40_000 and not any("\n" in t for t in lines["text"][:1000])
    assert len(set("".join(lines["text"]))) == 64                       # the 65th character, "\n", is gone


def test_arrow_cache_is_in_the_user_cache(shakespeare):
    files = [f["filename"] for f in shakespeare.dataset.cache_files]
    assert files and all(str(C.hf_cache_dir()) in f for f in files)
    again = C.char_corpus("tinyshakespeare")
    assert [f["filename"] for f in again.dataset.cache_files] == files  # the second run reads the cache
    assert torch.equal(again.train, shakespeare.train)


def test_tinystories_stories_repaired_and_compacted():
    from llmcourse.data.gpt2_tokenizer import EOT_ID

    ts = C.tinystories_corpus()
    raw = data_path("tinystories-sample").read_text(encoding="utf-8")
    stories = C.split_stories(raw)
    assert len(stories) == len(ts.dataset) == 1_097
    assert not any("â€" in s for s in stories) and "“" in "".join(stories)
    tok = ts.tokenizer
    assert int((ts.train == tok.eot_id).sum()) + int((ts.val == tok.eot_id).sum()) == 1_097
    assert tok.vocab[EOT_ID] == tok.eot_id and tok.vocab_size == len(tok.vocab) + 4 < 10_000
    assert min(tok.vocab.values()) == 4 and int(ts.train.min()) >= 4    # every training id is in the vocabulary
    assert tok.decode(ts.train[:40]) == tok.enc.decode(tok.encode_gpt2(stories[0])[:40])


# ---------------------------------------------------------------- get_batch


def test_get_batch_worked_example_and_generator_use():
    g = torch.Generator().manual_seed(0)
    x, y = C.get_batch(torch.arange(100), 2, 4, g)
    assert x.tolist() == [[44, 45, 46, 47], [15, 16, 17, 18]] and torch.equal(y, x + 1)
    ref = torch.Generator().manual_seed(0)
    torch.randint(0, 96, (2,), generator=ref)
    assert torch.equal(torch.rand(3, generator=g), torch.rand(3, generator=ref))  # exactly one draw


def test_get_batch_matches_hand_cut_windows():
    data = torch.randint(0, 50, (300,), generator=torch.Generator().manual_seed(1), dtype=torch.int32)
    x, y = C.get_batch(data, 8, 16, torch.Generator().manual_seed(3))
    offsets = torch.randint(0, 300 - 16, (8,), generator=torch.Generator().manual_seed(3))
    for b, o in enumerate(offsets.tolist()):
        assert x[b].tolist() == data[o:o + 16].tolist() and y[b].tolist() == data[o + 1:o + 17].tolist()
    assert x.dtype == y.dtype == torch.long and torch.equal(y[:, :-1], x[:, 1:])
    short = torch.arange(9)
    xs, ys = C.get_batch(short, 5, 8, torch.Generator().manual_seed(0))  # the only offset is 0
    assert torch.equal(xs, torch.arange(8).expand(5, 8)) and torch.equal(ys, torch.arange(1, 9).expand(5, 8))
    with pytest.raises(ValueError):
        C.get_batch(torch.arange(8), 2, 8, torch.Generator())
    with pytest.raises(ValueError):
        C.get_batch(torch.zeros(2, 20, dtype=torch.long), 2, 4, torch.Generator())


# ---------------------------------------------------------------- loss, perplexity, schedule


def test_lm_loss_is_flattened_cross_entropy():
    g = torch.Generator().manual_seed(0)
    logits, targets = torch.randn(3, 6, 6, generator=g), torch.randint(0, 6, (3, 6), generator=g)
    want = F.cross_entropy(logits.reshape(-1, 6), targets.reshape(-1))
    assert torch.allclose(lm_loss(logits, targets), want, atol=1e-7)
    assert not torch.allclose(F.cross_entropy(logits, targets), want)   # the unflattened call: dim 1 taken as classes
    targets[0, :3] = -100
    assert torch.allclose(lm_loss(logits, targets), F.cross_entropy(logits.reshape(-1, 6), targets.reshape(-1)))
    assert abs(lm_loss(torch.zeros(2, 3, 65), torch.zeros(2, 3, dtype=torch.long)).item() - math.log(65)) < 1e-6
    assert abs(perplexity(math.log(65)) - 65) < 1e-9
    with pytest.raises(ValueError):
        lm_loss(logits.reshape(-1, 6), targets.reshape(-1))


def test_initial_loss_of_char_tiny_is_ln_65(shakespeare):
    torch.manual_seed(0)
    model = GPT2Model(GPT2Config.preset("gpt2-char-tiny"))
    loss = P.estimate_loss(model, shakespeare.val, 32, 64, 4)
    assert abs(loss - math.log(65)) < 0.1


def test_warmup_cosine_fixture_and_properties():
    got = [warmup_cosine_lr(s, 1e-3, 1e-4, 10, 100) for s in (0, 9, 10, 55, 100, 150)]
    assert got == pytest.approx([1e-4, 1e-3, 1e-3, 5.5e-4, 1e-4, 1e-4], rel=1e-9, abs=1e-15)
    decay = [warmup_cosine_lr(s, 1e-3, 1e-4, 10, 100) for s in range(10, 200)]
    assert all(a >= b for a, b in zip(decay, decay[1:])) and decay[-1] == 1e-4
    assert warmup_cosine_lr(0, 1.0, 0.0, 0, 4) == 1.0
    for bad in ((-1, 10, 100), (0, 10, 10), (0, -1, 10)):
        with pytest.raises(ValueError):
            warmup_cosine_lr(bad[0], 1e-3, 1e-4, bad[1], bad[2])


# ---------------------------------------------------------------- clipping and parameter groups


def test_clip_grad_norm_fixture_and_torch_oracle():
    a, b, c = (torch.nn.Parameter(torch.zeros(n)) for n in (2, 2, 3))
    a.grad, b.grad = torch.tensor([3.0, 4.0]), torch.tensor([0.0, 12.0])
    assert O.clip_grad_norm(iter([a, b, c]), 1.0) == pytest.approx(13.0)
    assert torch.allclose(a.grad, torch.tensor([0.2308, 0.3077]), atol=1e-4)
    assert torch.allclose(b.grad, torch.tensor([0.0, 0.9231]), atol=1e-4)
    for max_norm in (0.05, 1e6):
        nets = []
        for _ in range(2):
            torch.manual_seed(0)
            net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
            net(torch.randn(4, 5)).pow(2).sum().backward()
            nets.append(net)
        ours = O.clip_grad_norm(nets[0].parameters(), max_norm)
        theirs = float(torch.nn.utils.clip_grad_norm_(nets[1].parameters(), max_norm))
        assert ours == pytest.approx(theirs, rel=1e-6)
        for p, q in zip(nets[0].parameters(), nets[1].parameters()):
            assert torch.allclose(p.grad, q.grad, atol=1e-7)


def test_parameter_groups_of_char_tiny():
    model = GPT2Model(GPT2Config.preset("gpt2-char-tiny"))
    opt = O.configure_optimizer(model, 3e-4)
    sizes = [sum(p.numel() for p in g["params"]) for g in opt.param_groups]
    assert sizes == [802_944, 6_912] and sum(sizes) == 809_856
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert tuple(opt.param_groups[0]["betas"]) == (0.9, 0.95)
    ids = [id(p) for g in opt.param_groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    # what the groups do: a step with zero gradients shrinks only the matrices, by 1 - lr*wd
    opt = O.configure_optimizer(model, 0.5, 0.2)
    before = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for p, w in zip(model.parameters(), before):
        assert torch.allclose(p, w * (0.9 if p.dim() >= 2 else 1.0), atol=1e-7)


# ---------------------------------------------------------------- checkpoints and the loop


def test_checkpoint_is_weights_only_and_a_pickled_module_is_not(tmp_path):
    model = tiny_gpt()
    opt = O.configure_optimizer(model, 1e-3)
    K.save_checkpoint(tmp_path / "ok.pt", model, opt, 7, {"note": "test", "sizes": [1, 2]})
    raw = torch.load(tmp_path / "ok.pt", map_location="cpu", weights_only=True)
    assert sorted(raw) == sorted(K.CHECKPOINT_KEYS) and raw["step"] == 7
    torch.save(model, tmp_path / "module.pt")
    with pytest.raises(Exception, match="(?i)weights_only|unpickl"):
        torch.load(tmp_path / "module.pt", weights_only=True)


def test_exact_resumption_with_dropout(tmp_path):
    data = torch.randint(0, 13, (500,), generator=torch.Generator().manual_seed(2))

    def lr_fn(s):
        return warmup_cosine_lr(s, 3e-3, 3e-4, 2, 10)

    def fresh(seed):
        m = tiny_gpt(dropout=0.1, seed=seed)
        return m, O.configure_optimizer(m, 3e-3)

    m, opt = fresh(0)
    torch.manual_seed(5)
    full = P.train_steps(m, opt, data, 10, 0, 4, 8, lr_fn, 1.0, 0)
    m, opt = fresh(0)
    torch.manual_seed(5)
    first = P.train_steps(m, opt, data, 5, 0, 4, 8, lr_fn, 1.0, 0)
    K.save_checkpoint(tmp_path / "c.pt", m, opt, 5, {"seed": 0})
    torch.manual_seed(123)
    m2, opt2 = fresh(9)
    step = K.load_checkpoint(tmp_path / "c.pt", m2, opt2)
    second = P.train_steps(m2, opt2, data, 5, step, 4, 8, lr_fn, 1.0, 0)
    assert step == 5 and full == pytest.approx(first + second, abs=1e-6)
    # without the RNG state the dropout masks differ
    torch.manual_seed(123)
    m3, opt3 = fresh(9)
    ckpt = torch.load(tmp_path / "c.pt", weights_only=True)
    m3.load_state_dict(ckpt["model"])
    opt3.load_state_dict(ckpt["optimizer"])
    assert P.train_steps(m3, opt3, data, 5, 5, 4, 8, lr_fn, 1.0, 0) != pytest.approx(full[5:], abs=1e-6)


def test_estimate_loss_restores_mode_and_loss_falls_on_repeated_batch():
    data = torch.randint(0, 13, (300,), generator=torch.Generator().manual_seed(3))
    model = tiny_gpt(dropout=0.3).train()
    a, b = P.estimate_loss(model, data, 4, 8, 3), P.estimate_loss(model, data, 4, 8, 3)
    assert a == b and model.training
    model.eval()
    P.estimate_loss(model, data, 4, 8, 3)
    assert not model.training
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    losses = P.train_steps(model, opt, data[:9], 15, 0, 4, 8, lambda s: 3e-2, 1.0, 0)
    assert losses[-1] < 0.5 * losses[0]


def test_pretrain_history_on_char_data(shakespeare):
    torch.manual_seed(0)
    model = GPT2Model(GPT2Config.preset("gpt2-char-tiny"))
    seen = []
    hist = P.pretrain(model, shakespeare.train, shakespeare.val, steps=12, batch_size=8, context_length=32,
                      max_lr=3e-3, min_lr=3e-4, warmup_steps=3, eval_every=5, eval_batches=2,
                      sample_fn=lambda m: "x", snapshot_steps=(0, 6, 12), callback=lambda h: seen.append(len(h["step"])),
                      progress=False)
    assert hist["step"] == list(range(1, 13)) and hist["eval_step"] == [0, 5, 6, 10, 12]   # snapshots evaluated
    assert abs(hist["val_loss"][0] - math.log(65)) < 0.1 and hist["val_loss"][-1] < hist["val_loss"][0]
    assert hist["lr"] == pytest.approx([warmup_cosine_lr(s, 3e-3, 3e-4, 3, 12) for s in range(12)])
    assert sorted(hist["snapshots"]) == [0, 6, 12] and len(hist["samples"]) == 5 and seen == [0, 5, 6, 10, 12]
    assert all(n > 0 for n in hist["grad_norm"]) and hist["tokens_per_step"] == 256 and not model.training


# ---------------------------------------------------------------- the shipped character model


def test_char_model_loader_builds_from_stored_config(tmp_path, capsys):
    from llmcourse.train.char_model import load_gpt_char_tiny, train_gpt_char_tiny

    path = tmp_path / "char.pt"
    train_gpt_char_tiny(save=True, progress=False, path=path, steps=3, warmup_steps=1, eval_every=3,
                        eval_batches=1, context_length=24)
    model, tok = load_gpt_char_tiny(path)
    assert model.cfg.context_length == 24 and tok.vocab_size == 65 and not model.training
    raw = torch.load(path, weights_only=True)
    assert "optimizer" not in raw and raw["config"]["context_length"] == 24
    with pytest.raises(FileNotFoundError, match="llmcourse.train.char_model"):
        load_gpt_char_tiny(tmp_path / "missing.pt", retrain=False)


def test_shipped_asset():
    from llmcourse.train.char_model import GPT_CHAR_TINY_RECIPE, gpt_char_tiny_path, load_gpt_char_tiny

    path = gpt_char_tiny_path()
    if not path.exists():
        pytest.skip("assets/gpt_char_tiny.pt not built yet (python -m llmcourse.train.char_model)")
    assert path.stat().st_size < 5_000_000
    model, tok = load_gpt_char_tiny()
    info = model.checkpoint_info
    assert model.cfg.context_length == 128 and info["recipe"] == GPT_CHAR_TINY_RECIPE and not info["substitute"]
    assert tok.chars == C.char_corpus().tokenizer.chars
    assert info["val_loss"] < 1.8
    corpus = C.char_corpus()
    val = P.estimate_loss(model, corpus.val, 32, 128, 20, P.EVAL_SEED)
    assert val == pytest.approx(info["val_loss"], abs=1e-4)            # the stored number is reproducible


# ---------------------------------------------------------------- widgets


def _hist():
    return {"step": [1, 2, 3, 4], "loss": [4.2, 3.9, 3.5, 3.1], "lr": [1e-3, 2e-3, 3e-3, 2e-3],
            "grad_norm": [2.0, 0.5, 1.5, 0.7], "tokens_per_s": [1000.0, 1200.0, 1100.0, 1300.0], "eval_step": [0, 4],
            "train_loss_eval": [4.2, 3.0], "val_loss": [4.2, 3.2], "samples": [(0, "abc"), (4, "de\nf")],
            "max_norm": 1.0, "tokens_per_step": 512}


def test_dashboard_summary_and_figures():
    from llmcourse.viz import base
    from llmcourse.viz import pretraining as V

    s = V.dashboard_summary(_hist())
    assert s["steps"] == 4 and s["val_loss"] == 3.2 and s["val_perplexity"] == pytest.approx(math.exp(3.2))
    assert s["clipped_fraction"] == 0.5 and s["tokens_per_s"] == 1150.0
    assert s["ms_per_step"] == pytest.approx(1000 * 512 / 1150)
    assert V.smooth([1, 2, 3, 4], 2).tolist() == [1.0, 1.5, 2.5, 3.5]
    assert V.schedule_curve(1e-3, 1e-4, 10, 100) == [warmup_cosine_lr(s, 1e-3, 1e-4, 10, 100) for s in range(121)]
    assert isinstance(V.draw_dashboard(_hist(), vocab_size=65), Figure)
    assert isinstance(V.draw_dashboard({"max_norm": 1.0}), Figure)    # before the first step
    rows = [{"step": 0, "greedy": "aaa", "sampled": "xyz\nq", "val_loss": 4.17},
            {"step": 10, "greedy": "bb", "sampled": "c", "val_loss": math.nan}]
    for shown in (V.show_training_dashboard(_hist(), 65, static=True), V.show_schedule_explorer(static=True),
                  V.show_checkpoint_sampler(rows, static=True)):
        assert isinstance(shown, base.StaticFigure) and shown._repr_png_().startswith(b"\x89PNG")


def test_checkpoint_samples_from_snapshots():
    from llmcourse.data.tokenizers import CharTokenizer
    from llmcourse.viz.pretraining import checkpoint_samples

    tok = CharTokenizer(list("abcdefghijklm"))
    model = tiny_gpt()
    snaps = {0: model.state_dict(), 5: {k: v + 0.1 for k, v in model.state_dict().items()}}
    rows = checkpoint_samples(snaps, tiny_gpt, tok, prompt="abc", n_chars=10, val_losses={0: 2.5})
    assert [r["step"] for r in rows] == [0, 5] and all(len(r["greedy"]) == len(r["sampled"]) == 10 for r in rows)
    assert rows[0]["val_loss"] == 2.5 and math.isnan(rows[1]["val_loss"])
    again = checkpoint_samples(snaps, tiny_gpt, tok, prompt="abc", n_chars=10, sampled={5: rows[1]["sampled"]})
    assert again == [{**r, "val_loss": again[i]["val_loss"]} for i, r in enumerate(rows)]   # reused = redrawn


def test_live_widgets_build():
    pytest.importorskip("ipywidgets")
    from llmcourse.viz import pretraining as V

    w = V.show_training_dashboard(_hist(), static=False)
    assert "llmcourse-w10-1" in w._dom_classes
    assert "llmcourse-w10-2" in V.show_schedule_explorer(static=False)._dom_classes
    rows = [{"step": 0, "greedy": "aaa", "sampled": "xyz", "val_loss": 4.17}]
    assert "llmcourse-w10-3" in V.show_checkpoint_sampler(rows, static=False)._dom_classes
    box, callback = V.make_training_dashboard(10, 65, static=False)
    callback(_hist())
    assert "llmcourse-w10-1" in box._dom_classes and V.make_training_dashboard(static=True) == (None, None)


def test_trained_asset_time_is_read_from_the_file_not_typed():
    """The README row and the pipeline's docstring type no training time for gpt_char_tiny.pt; the lesson
    prints the time the asset recorded (its ``seconds``)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    row = next(line for line in (root / "README.md").read_text().splitlines() if "`assets/gpt_char_tiny.pt`" in line)
    assert not re.search(r"\d\s*(min|minutes|s)\b", row), row
    doc = (root / "llmcourse" / "train" / "char_model.py").read_text().split('"""')[1]
    assert not re.search(r"\d+\s*-\s*\d+\s*minutes", doc)
    lesson = (root / "notebooks" / "lessons" / "10_gpt2_pretraining.py").read_text()
    assert "info['seconds']" in lesson
    ckpt = torch.load(root / "assets" / "gpt_char_tiny.pt", map_location="cpu", weights_only=True)
    assert ckpt["seconds"] > 0


def test_weight_decay_shrink_follows_the_schedule():
    """AdamW with zero gradients stepped through warmup_cosine_lr shrinks a weight by ∏(1 − lr(s)·wd), which is
    less shrink than (1 − max_lr·wd)^steps."""
    from llmcourse.train.schedules import warmup_cosine_lr

    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([w], lr=1e-3, weight_decay=0.1)
    lrs = [warmup_cosine_lr(s, 3e-3, 3e-4, 10, 200) for s in range(200)]
    for lr in lrs:
        opt.param_groups[0]["lr"] = lr
        w.grad = torch.zeros(3)
        opt.step()
    predicted = math.prod(1 - lr * 0.1 for lr in lrs)
    assert abs(float(w.detach()[0]) - predicted) < 1e-5
    assert predicted > (1 - 3e-3 * 0.1) ** 200 + 1e-3


# ---------------------------------------------------------------- gradient accumulation

def _accumulation_matches(accumulate, micro_batches):
    """Whether ``accumulate(model, x, y, k)`` leaves in ``.grad`` the gradient of the whole batch's mean loss (the
    oracle: one backward of ``F.cross_entropy`` over all B·T positions) and returns that loss."""
    x = torch.randint(0, 13, (7, 16), generator=torch.Generator().manual_seed(5))
    y = torch.randint(0, 13, (7, 16), generator=torch.Generator().manual_seed(6))
    model = tiny_gpt()
    whole = F.cross_entropy(model(x).reshape(-1, 13), y.reshape(-1))
    whole.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    loss = accumulate(model, x, y, micro_batches)
    return abs(loss - whole.item()) < 1e-5 and all(
        torch.allclose(p.grad, want[n], atol=1e-6, rtol=1e-4) for n, p in model.named_parameters())


@pytest.mark.parametrize("micro_batches", [1, 2, 3, 7])   # 7 rows: 3 gives uneven micro-batches 3 + 2 + 2
def test_accumulated_gradients_equal_the_whole_batch(micro_batches):
    assert _accumulation_matches(P.accumulate_gradients, micro_batches)


def test_accumulation_mutant_that_does_not_weight_fails():
    import inspect

    src = inspect.getsource(P.accumulate_gradients)
    assert "(loss * share).backward()" in src
    scope = dict(vars(P))
    exec(src.replace("(loss * share).backward()", "loss.backward()"), scope)   # noqa: S102 - the mutant
    mutant = scope["accumulate_gradients"]
    assert _accumulation_matches(mutant, 1)            # one micro-batch: nothing to weigh, the mutant agrees
    assert not _accumulation_matches(mutant, 2) and not _accumulation_matches(mutant, 3)
    with pytest.raises(ValueError, match="micro_batches"):
        P.accumulate_gradients(tiny_gpt(), torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long), 3)


def test_train_step_with_micro_batches_takes_the_same_step():
    x = torch.randint(0, 13, (6, 16), generator=torch.Generator().manual_seed(7))
    y = torch.randint(0, 13, (6, 16), generator=torch.Generator().manual_seed(8))
    after = []
    for k in (1, 3):
        model = tiny_gpt()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        loss, norm = P.train_step(model, opt, x, y, 1e-2, 0.5, micro_batches=k)
        after.append((loss, norm, torch.cat([p.detach().flatten() for p in model.parameters()])))
    (l1, n1, w1), (l3, n3, w3) = after
    assert abs(l1 - l3) < 1e-5 and abs(n1 - n3) < 1e-4 * n1 and torch.allclose(w1, w3, atol=1e-6)


# ---------------------------------------------------------------- time to quality

def test_budget_recipe_ends_its_schedule_with_the_budget():
    r = P.budget_recipe(5, 50.0)
    assert r["steps"] == 5 * 60_000 // 50 and r["warmup_steps"] == min(100, r["steps"] // 20)
    lr = [warmup_cosine_lr(s, r["max_lr"], r["min_lr"], r["warmup_steps"], r["steps"]) for s in range(r["steps"] + 1)]
    assert lr[r["steps"]] == pytest.approx(r["min_lr"]) and max(lr) == pytest.approx(r["max_lr"])
    assert P.budget_recipe(10, 50.0)["steps"] == 2 * r["steps"]        # twice the minutes, twice the steps
    with pytest.raises(ValueError, match="steps"):
        P.budget_recipe(0.01, 100.0)
    with pytest.raises(ValueError, match="positive"):
        P.budget_recipe(1, 0)


def test_time_to_quality_composes_step_curves_with_ms_per_step():
    from coursetools.bench.time_to_quality import NANOGPT, loss_at, wall_curve

    curve = {"step": [0, 100, 200], "val_loss": [4.0, 3.0, 2.0]}
    wall = wall_curve(curve, 50.0)                                      # 100 steps = 5 s
    assert wall == [(0.0, 4.0), (5.0, 3.0), (10.0, 2.0)]
    assert loss_at(wall, 2.5) == pytest.approx(3.5) and loss_at(wall, 60.0) == 2.0   # a finished run stays put
    assert (NANOGPT.batch_size, NANOGPT.context_length, NANOGPT.steps, NANOGPT.max_lr, NANOGPT.min_lr,
            NANOGPT.warmup_steps, NANOGPT.betas) == (12, 64, 2000, 1e-3, 1e-4, 100, (0.9, 0.99))


def test_time_to_quality_report_maps_budgets_to_stored_steps():
    from coursetools.bench.time_to_quality import report_rows

    nano = {"recipe": "nanoGPT", "steps": 2000, "complete": True, "step": [0, 1000, 2000], "val_loss": [4.0, 2.0, 1.9]}
    # at 30 ms/step the course gets 2,000 steps in 1 min and 4,000 in 2; the 1-minute run was stored with 1,900 steps
    course = {"recipe": "course", "steps": 1900, "complete": True, "step": [0, 1900], "val_loss": [4.0, 1.8]}
    curves = {"runs": {"nanoGPT": nano, "course 1900": course}}
    rows = report_rows(curves, {"ms_per_step": {"nanoGPT": 60.0, "course": 30.0}}, [0.5, 1, 2, 5])
    assert [r["nanoGPT_steps"] for r in rows] == [500, 1000, 2000, 2000]          # a finished run stays put
    assert [r["nanoGPT"] for r in rows] == pytest.approx([3.0, 2.0, 1.9, 1.9])   # linear between evaluations
    assert [r["course_steps"] for r in rows] == [1000, 2000, 4000, 10000]
    assert [r["course_run"] for r in rows] == [None, 1900, None, None]           # 1,900 >= 90 % of 2,000 and fits
    assert [r["ahead"] for r in rows] == [None, "course", None, None]
    assert rows[2]["missing"] == ["curves --course-steps 4000"]


def test_laptop_run_is_the_budget_recipe():
    from llmcourse.runtime import profile

    lap = profile("10", name="laptop")
    r = P.budget_recipe(1, 60_000 / lap["train_steps"])              # the budget that gives the profile's steps
    assert {k: lap[k] for k in ("batch_size", "context_length", "train_steps", "warmup_steps", "max_lr", "min_lr",
                                "weight_decay", "max_norm")} == {
        "batch_size": r["batch_size"], "context_length": r["context_length"], "train_steps": r["steps"],
        "warmup_steps": r["warmup_steps"], "max_lr": r["max_lr"], "min_lr": r["min_lr"],
        "weight_decay": r["weight_decay"], "max_norm": r["max_norm"]}
