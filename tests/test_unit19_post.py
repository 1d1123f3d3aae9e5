"""Unit 19 library: the addition task and its reward, the SFT loss mask, and the GRPO pieces.

Oracles are independent of the code under test: hand computations on small fixed numbers, Python loops over
the formulas of DeepSeekMath (2024) eq. 3 and 4 in float64, ``torch.distributions.kl_divergence`` for the
expectation of the k3 estimator, an uncached prefix-by-prefix forward for the per-token log-probabilities,
and unit 12's greedy ``generate_cached`` for the sampler's low-temperature limit.
"""

from __future__ import annotations

import math

import pytest
import torch

from llmcourse.models.llama3 import Llama3Config, Llama3Model
from llmcourse.models.llama3_cached import CachedLlama3Model, generate_cached
from llmcourse.post import (
    AdditionTask,
    ChatTokenizer,
    addition_reward,
    completion_mask,
    evaluate_accuracy,
    frozen_copy,
    group_relative_advantages,
    grpo_loss,
    grpo_step,
    kl_k3,
    parse_completion,
    per_token_logps,
    sample_completions,
    sft_batch,
    sft_labels,
    sft_loss,
    sft_train,
)


def tiny_model(seed=0, cached=True):
    torch.manual_seed(seed)
    cfg = Llama3Config(vocab_size=16, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=64,
                       context_length=16, rope_theta=10000.0)
    return (CachedLlama3Model if cached else Llama3Model)(cfg).eval()


# ---------------------------------------------------------------- task and reward

def test_tokenizer_round_trip_and_errors():
    tok = ChatTokenizer()
    text = "<bos><user>07+35<assistant>42<eos>"
    ids = tok.encode(text)
    assert ids == [1, 3, 5, 12, 15, 8, 10, 4, 9, 7, 2]
    assert tok.decode(ids) == text and tok.vocab_size == 16
    with pytest.raises(ValueError, match="vocabulary"):
        tok.encode("1-2")
    with pytest.raises(ValueError, match="outside"):
        tok.decode([16])


@pytest.mark.parametrize("completion, answer, expected", [
    ("42<eos>", 42, 1.1),                 # correct (and so well-formed)
    ("42<eos><eos><eos>", 42, 1.1),       # the fill after the first <eos> is ignored
    ("43<eos>", 42, 0.1),                 # well-formed, wrong
    ("042<eos>", 42, 0.0),                # a leading zero is not the format
    ("0<eos>", 0, 1.1),                   # ... but 0 itself is
    ("42", 42, 0.0),                      # cut off: no <eos>
    ("<eos>", 42, 0.0),                   # empty answer
    ("4+2<eos>", 6, 0.0),
    ("<pad>42<eos>", 42, 0.0),
])
def test_reward_table(completion, answer, expected):
    assert addition_reward(completion, answer) == pytest.approx(expected)


def test_reward_weights_and_parse():
    assert addition_reward("7<eos>", 7, correct_weight=2.0, format_weight=0.5) == 2.5
    assert addition_reward("8<eos>", 7, correct_weight=2.0, format_weight=0.0) == 0.0
    assert parse_completion("120<eos>99") == 120 and parse_completion("12") is None
    # the length bonus counts tokens before the first <eos> (a special token is one token)
    assert addition_reward("42<eos>", 42, length_weight=0.5) == pytest.approx(1.1 + 2 * 0.5)
    assert addition_reward("0042", 42, length_weight=0.25) == pytest.approx(1.0)
    assert addition_reward("4<pad>2<eos>", 42, format_weight=0.0, length_weight=1.0) == pytest.approx(3.0)


def test_task_split_prompts_and_rewards():
    task = AdditionTask(2, n_test=300, seed=3)
    assert task.prompt_len == 8 and task.max_new_tokens == 4 and task.test_pairs.shape == (300, 2)
    # the held-out pairs are distinct and never drawn for training
    assert len({tuple(p) for p in task.test_pairs.tolist()}) == 300
    train = task.sample_train(5000, torch.Generator().manual_seed(0))
    assert not task.is_test(train).any() and task.is_test(task.test_pairs).all()
    assert int(train.min()) >= 0 and int(train.max()) <= 99
    # seeded: the same split twice, another seed another split
    assert torch.equal(AdditionTask(2, 300, 3).test_pairs, task.test_pairs)
    assert not torch.equal(AdditionTask(2, 300, 4).test_pairs, task.test_pairs)
    p = task.prompts(torch.tensor([[7, 35]]))
    assert task.tokenizer.decode(p[0]) == "<bos><user>07+35<assistant>"
    tok = task.tokenizer
    comps = torch.tensor([tok.encode("42<eos><eos>"), tok.encode("41<eos><eos>"), tok.encode("4242")])
    pairs = torch.tensor([[7, 35], [7, 35], [7, 35]])
    assert task.rewards(pairs, comps).tolist() == pytest.approx([1.1, 0.1, 0.0])
    assert task.correct(pairs, comps).tolist() == [True, False, False]
    with pytest.raises(ValueError):
        AdditionTask(4)
    with pytest.raises(ValueError):
        AdditionTask(1, n_test=100)


# ---------------------------------------------------------------- SFT

def test_sft_batch_and_labels_by_hand():
    task = AdditionTask(1, n_test=10, seed=0)
    ids = sft_batch(task, torch.tensor([[2, 3], [9, 8]]))
    tok = task.tokenizer
    assert tok.decode(ids[0]) == "<bos><user>2+3<assistant>5<eos><pad>"
    assert tok.decode(ids[1]) == "<bos><user>9+8<assistant>17<eos>"
    labels = sft_labels(ids, task.prompt_len, tok.pad_id)
    X = -100
    # position t-1 predicts token t; only t >= prompt_len (= 6) and not <pad> are targets
    assert labels.tolist() == [[X, X, X, X, X, 10, 2, X], [X, X, X, X, X, 6, 12, 2]]


def test_sft_loss_equals_a_loop_over_answer_tokens():
    g = torch.Generator().manual_seed(0)
    task = AdditionTask(2, n_test=10, seed=0)
    ids = sft_batch(task, torch.tensor([[1, 2], [55, 66], [99, 99]]))
    logits = torch.randn(*ids.shape, 16, generator=g, dtype=torch.float64)
    total, count = 0.0, 0
    for r in range(ids.shape[0]):
        for t in range(task.prompt_len, ids.shape[1]):
            if ids[r, t] == task.tokenizer.pad_id:
                continue
            row = logits[r, t - 1].tolist()
            lse = math.log(sum(math.exp(v) for v in row))
            total += lse - row[int(ids[r, t])]
            count += 1
    assert count == 2 + 4 + 4   # "3<eos>", "121<eos>", "198<eos>"
    assert sft_loss(logits, ids, task.prompt_len, 0).item() == pytest.approx(total / count, rel=1e-12)


def test_sft_loss_gives_no_gradient_to_prompt_positions():
    task = AdditionTask(2, n_test=10, seed=0)
    ids = sft_batch(task, torch.tensor([[12, 34], [5, 6]]))
    logits = torch.randn(*ids.shape, 16, requires_grad=True)
    sft_loss(logits, ids, task.prompt_len, 0).backward()
    g = logits.grad.abs().sum(-1)
    assert torch.all(g[:, : task.prompt_len - 1] == 0)          # prompt positions predict prompt tokens
    assert torch.all(g[:, task.prompt_len - 1: task.prompt_len + 1] > 0)
    assert g[1, -1] == 0                                          # row 1 "11<eos><pad>": last position is fill
    with pytest.raises(ValueError):
        sft_loss(logits[:, :-1], ids, task.prompt_len, 0)
    with pytest.raises(ValueError):
        sft_labels(ids, ids.shape[1], 0)


def test_sft_train_lowers_the_loss():
    task = AdditionTask(1, n_test=20, seed=0)
    m = tiny_model()
    losses = sft_train(m, task, steps=40, batch_size=32, lr=1e-2, seed=0)
    assert len(losses) == 40 and sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5
    assert not m.training


# ---------------------------------------------------------------- GRPO pieces

def test_group_relative_advantages_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5, 1.1, 0.1, 1.1, 0.1])
    a = group_relative_advantages(r, 4)
    # group 0: mean 0.25, sample std sqrt((0.75² + 3·0.25²)/3) = 0.5 -> (1.5, -0.5, -0.5, -0.5)
    # group 1: no spread -> zeros; group 2: mean 0.6, sample std sqrt(4·0.25/3) -> ±0.5·sqrt(3)
    h = 0.5 * math.sqrt(3)
    assert a.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5, 0, 0, 0, 0, h, -h, h, -h], abs=1e-6)
    assert torch.isfinite(group_relative_advantages(torch.zeros(6), 3)).all()
    a_eps = group_relative_advantages(r, 4, eps=1e-4)
    assert a_eps[0].item() == pytest.approx(0.75 / (0.5 + 1e-4), rel=1e-6) and a_eps[4] == 0
    for bad in [(r, 1), (r, 5), (r.view(3, 4), 4)]:
        with pytest.raises(ValueError):
            group_relative_advantages(*bad)


def test_group_relative_advantages_properties():
    g = torch.Generator().manual_seed(1)
    r = torch.rand(8 * 6, generator=g)
    a = group_relative_advantages(r, 6).view(8, 6)
    assert torch.allclose(a.mean(1), torch.zeros(8), atol=1e-6)
    assert torch.allclose(a.std(1), torch.ones(8), atol=1e-5)
    # the groups are independent: changing one group's rewards leaves the others' advantages
    r2 = r.clone()
    r2[:6] += 10
    assert torch.equal(group_relative_advantages(r2, 6).view(8, 6)[1:], a[1:])


def test_completion_mask_by_hand():
    E = 2
    c = torch.tensor([[5, 6, E, E], [E, E, E, E], [5, 5, 5, 5], [7, E, 8, E]])
    assert completion_mask(c, E).int().tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]]


def test_per_token_logps_against_prefix_by_prefix_forward():
    m = tiny_model(1, cached=False)
    g = torch.Generator().manual_seed(2)
    seqs = torch.randint(0, 16, (3, 11), generator=g)
    P = 7
    got = per_token_logps(m, seqs, P)
    assert got.shape == (3, 4)
    with torch.no_grad():
        for t in range(4):
            lp = torch.log_softmax(m(seqs[:, : P + t])[:, -1].double(), -1)
            want = lp.gather(1, seqs[:, P + t: P + t + 1]).squeeze(1)
            assert torch.allclose(got[:, t].double(), want, atol=1e-5)
    with pytest.raises(ValueError):
        per_token_logps(m, seqs, 0)
    with pytest.raises(ValueError):
        per_token_logps(m, seqs.float(), P)


def test_kl_k3_formula_and_expectation():
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.2, 0.6], dtype=torch.float64)
    k = kl_k3(p.log(), q.log())
    for i in range(3):
        ratio = q[i].item() / p[i].item()
        assert k[i].item() == pytest.approx(ratio - math.log(ratio) - 1, rel=1e-12)
    assert (k >= 0).all() and kl_k3(p.log(), p.log()).abs().max() == 0
    # unbiased: its expectation under the policy p is KL(p || q)
    exact = torch.distributions.kl_divergence(torch.distributions.Categorical(p), torch.distributions.Categorical(q))
    assert (p * k).sum().item() == pytest.approx(exact.item(), rel=1e-12)


def _grpo_loss_loop(logps, old, ref, adv, mask, eps, beta):
    """DeepSeekMath eq. 3 with eq. 4, term by term in Python floats."""
    N, T = len(logps), len(logps[0])
    total = 0.0
    for i in range(N):
        n_i = sum(mask[i])
        s = 0.0
        for t in range(T):
            if not mask[i][t]:
                continue
            rho = math.exp(logps[i][t] - old[i][t])
            clipped = min(max(rho, 1 - eps), 1 + eps)
            surr = min(rho * adv[i], clipped * adv[i])
            ratio_ref = math.exp(ref[i][t]) / math.exp(logps[i][t])
            kl = ratio_ref - math.log(ratio_ref) - 1
            s += surr - beta * kl
        total += s / n_i if n_i else 0.0
    return -total / N


def test_grpo_loss_equals_the_paper_formula():
    g = torch.Generator().manual_seed(3)
    N, T = 6, 5
    old = torch.log_softmax(torch.randn(N, T, 7, generator=g, dtype=torch.float64), -1)[..., 0]
    logps = old + 0.4 * torch.randn(N, T, generator=g, dtype=torch.float64)   # ratios well outside 1 ± 0.2
    ref = old + 0.3 * torch.randn(N, T, generator=g, dtype=torch.float64)
    adv = torch.tensor([1.2, -0.7, 0.0, 2.0, -1.5, 0.3], dtype=torch.float64)
    mask = torch.ones(N, T, dtype=torch.bool)
    mask[0, 3:] = False
    mask[4, 1:] = False
    for eps, beta in [(0.2, 0.04), (0.1, 0.0), (0.3, 0.5)]:
        want = _grpo_loss_loop(logps.tolist(), old.tolist(), ref.tolist(), adv.tolist(), mask.tolist(), eps, beta)
        got = grpo_loss(logps, old, ref, adv, mask, clip_eps=eps, beta=beta)
        assert got.item() == pytest.approx(want, rel=1e-10)
    ratio = torch.exp(logps - old)
    assert ((ratio - 1).abs() > 0.2).float().mean() > 0.3        # the clip is exercised


def test_grpo_loss_hand_values_and_gradients():
    # one row, two tokens, ratios e^{0.5} ≈ 1.65 (clipped to 1.2 for A > 0) and e^{-0.5} ≈ 0.61 (kept: min)
    logps = torch.tensor([[0.0, -1.0]], requires_grad=True)
    old = torch.tensor([[-0.5, -0.5]])
    ref = logps.detach().clone()            # no KL
    adv = torch.tensor([1.0])
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss = grpo_loss(logps, old, ref, adv, mask, clip_eps=0.2, beta=0.04)
    assert loss.item() == pytest.approx(-(1.2 + math.exp(-0.5)) / 2, rel=1e-6)
    loss.backward()
    # the clipped token has no gradient; the other has -ρ·A/|o|
    assert logps.grad.tolist()[0] == pytest.approx([0.0, -math.exp(-0.5) / 2], rel=1e-6)
    # at ratio 1 and beta 0 the gradient is -A_i/(|o_i|·N) on each of row i's tokens (a policy gradient)
    lp = torch.zeros(2, 3, requires_grad=True)
    m = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    grpo_loss(lp, lp.detach(), lp.detach(), torch.tensor([2.0, -3.0]), m, beta=0.0).backward()
    assert torch.allclose(lp.grad, torch.tensor([[-0.5, -0.5, 0.0], [0.5, 0.5, 0.5]]))
    # the KL pulls toward the reference: its gradient at logps is beta·(1 - exp(ref - logps))
    lp = torch.zeros(1, 1, requires_grad=True)
    grpo_loss(lp, lp.detach(), torch.tensor([[-1.0]]), torch.zeros(1), torch.ones(1, 1), beta=0.5).backward()
    assert lp.grad.item() == pytest.approx(0.5 * (1 - math.exp(-1.0)), rel=1e-6)
    with pytest.raises(ValueError):
        grpo_loss(lp, lp, lp, torch.zeros(2), torch.ones(1, 1))


# ---------------------------------------------------------------- sampling and the step

def test_sampling_low_temperature_is_greedy_and_seeded():
    m = tiny_model(4)
    task = AdditionTask(2, n_test=10, seed=0)
    prompts = task.prompts(task.test_pairs[:5])
    greedy = generate_cached(m, prompts, 4)
    cold = sample_completions(m, prompts, 4, eos_id=-1, temperature=1e-4,
                              generator=torch.Generator().manual_seed(0))
    assert torch.equal(cold, greedy)
    a = sample_completions(m, prompts, 4, 2, 1.0, torch.Generator().manual_seed(5))
    b = sample_completions(m, prompts, 4, 2, 1.0, torch.Generator().manual_seed(5))
    assert torch.equal(a, b) and torch.equal(a[:, :8], prompts)
    with pytest.raises(ValueError):
        sample_completions(m, prompts, 4, 2, 0.0)


def test_sampling_follows_the_tempered_softmax():
    m = tiny_model(5)
    prompt = torch.tensor([[1, 3, 6, 7, 15, 8, 9, 4]])
    with torch.no_grad():
        probs = torch.softmax(m(prompt)[0, -1].double() / 0.7, -1)
    n = 4000
    out = sample_completions(m, prompt.repeat(n, 1), 1, eos_id=-1, temperature=0.7,
                             generator=torch.Generator().manual_seed(6))
    freq = torch.bincount(out[:, -1], minlength=16).double() / n
    assert (freq - probs).abs().max() < 4 * math.sqrt(0.25 / n)


def test_sampled_rows_stop_at_eos():
    m = tiny_model(6)
    E = 2
    out = sample_completions(m, torch.tensor([[1, 3, 5]]).repeat(64, 1), 6, E, 3.0,
                             torch.Generator().manual_seed(0))[:, 3:]
    seen = torch.cumsum((out == E).long(), 1) > 0
    shifted = torch.cat([torch.zeros(64, 1, dtype=torch.bool), seen[:, :-1]], 1)
    assert torch.all(out[shifted] == E)                 # after an <eos> only <eos>


def test_grpo_step_updates_the_policy_only():
    task = AdditionTask(1, n_test=20, seed=0)
    policy = tiny_model(7)
    ref = frozen_copy(policy)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    assert all(not p.requires_grad for p in ref.parameters()) and not ref.training
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    stats = grpo_step(policy, ref, opt, task, task.sample_train(4, torch.Generator().manual_seed(0)),
                      group_size=4, temperature=1.0, inner_steps=2, generator=torch.Generator().manual_seed(1))
    assert set(stats) == {"reward", "accuracy", "length", "kl", "loss", "zero_std_groups", "clip_fraction"}
    assert all(math.isfinite(v) for v in stats.values())
    assert 1 <= stats["length"] <= task.max_new_tokens and stats["kl"] == pytest.approx(0.0, abs=1e-6)
    for k, v in ref.state_dict().items():
        assert torch.equal(v, before[k])
    if stats["zero_std_groups"] < 1:
        assert any(not torch.equal(v, before[k]) for k, v in policy.state_dict().items())


def test_evaluate_accuracy_counts_correct_greedy_answers():
    task = AdditionTask(1, n_test=20, seed=0)
    m = tiny_model(8)
    acc = evaluate_accuracy(m, task, task.test_pairs, batch_size=7)
    seqs = generate_cached(m, task.prompts(task.test_pairs), task.max_new_tokens, task.tokenizer.eos_id)
    want = sum(parse_completion(task.tokenizer.decode(s[task.prompt_len:])) == a + b
               for (a, b), s in zip(task.test_pairs.tolist(), seqs))
    assert acc == want / 20


def test_run_post_training_tiny_is_seeded_and_keeps_the_reference():
    from llmcourse.post.run import run_post_training

    kw = dict(n_digits=1, n_test=20, sft_steps=3, sft_batch=16, grpo_iters=2, prompts_per_step=2, group_size=4,
              eval_every=1)
    seen = []
    a = run_post_training(0, callback=lambda phase, step, stats: seen.append((phase, step)), **kw)
    b = run_post_training(0, **kw)
    assert seen == [("sft", 0), ("sft", 1), ("sft", 2), ("grpo", 0), ("grpo", 1)]
    for k in ("acc_before", "acc_sft", "acc_grpo"):
        assert 0.0 <= a[k] <= 1.0 and a[k] == b[k]
    assert a["sft_losses"] == b["sft_losses"] and len(a["grpo"]) == 2 and "test_accuracy" in a["grpo"][1]
    assert all(not p.requires_grad for p in a["sft_model"].parameters())
    # the reference is the model after SFT: the run's first-iteration KL is measured against it and is 0
    assert a["grpo"][0]["kl"] == pytest.approx(0.0, abs=1e-6)


def test_sft_train_with_a_pool_only_sees_the_pool(monkeypatch):
    import llmcourse.post.sft as sft

    task = AdditionTask(2, n_test=10, seed=0)
    pool = torch.tensor([[11, 22], [33, 44], [55, 66]])
    seen = []
    real = sft.sft_batch
    monkeypatch.setattr(sft, "sft_batch", lambda t, pairs: seen.append(pairs) or real(t, pairs))
    sft.sft_train(tiny_model(), task, steps=3, batch_size=8, lr=1e-3, seed=0, pool=pool)
    drawn = {tuple(p) for batch in seen for p in batch.tolist()}
    assert len(seen) == 3 and drawn <= {(11, 22), (33, 44), (55, 66)} and len(drawn) > 1


def test_stored_sft_models_asset_is_plain_small_and_reproduces_its_accuracies():
    from llmcourse.post.run import POST_MODEL, POST_RECIPE, build_post_model, load_sft_models, sft_asset_path

    path = sft_asset_path()
    assert path.exists() and path.stat().st_size < 5 * 2 ** 20
    stored = torch.load(path, weights_only=True)          # plain data only
    assert load_sft_models(retrain=False)["acc_sft"] == stored["acc_sft"]
    assert stored["config"] == POST_MODEL and not stored["substitute"]
    assert stored["seeds"] == [0, 1, 2]
    assert all(stored["recipe"][k] == POST_RECIPE[k] for k in ("sft_steps", "sft_batch", "sft_lr", "sft_pool", "n_test"))
    task = AdditionTask(stored["recipe"]["n_digits"], stored["recipe"]["n_test"], stored["recipe"]["split_seed"])
    seed = 0
    model = build_post_model(seed)
    model.load_state_dict(stored["models"][seed])
    assert evaluate_accuracy(model, task, task.test_pairs) == pytest.approx(stored["acc_sft"][seed], abs=0.01)
    assert stored["acc_before"][seed] == 0.0 and stored["acc_sft"][seed] > 0.3


def test_missing_sft_asset_names_its_command(tmp_path):
    from llmcourse.post.run import load_sft_models

    with pytest.raises(FileNotFoundError, match="llmcourse.post.run --save-sft"):
        load_sft_models(tmp_path / "absent.pt", retrain=False)


def test_run_post_training_from_a_stored_sft_state_skips_sft(tmp_path):
    from llmcourse.post.run import load_sft_models, run_post_training, train_sft_models

    kw = dict(n_digits=1, n_test=20, sft_steps=3, sft_batch=16, prompts_per_step=2, group_size=4)
    saved = train_sft_models([0], save=True, path=tmp_path / "sft.pt", verbose=False, **kw)
    stored = load_sft_models(tmp_path / "sft.pt", retrain=False)
    assert stored["acc_sft"] == saved["acc_sft"]
    full = run_post_training(0, grpo_iters=2, **kw)
    resumed = run_post_training(0, sft_state=stored["models"][0], grpo_iters=2, **kw)
    assert resumed["sft_losses"] == [] and resumed["seconds_sft"] == 0.0
    assert resumed["acc_sft"] == full["acc_sft"] == stored["acc_sft"][0]
    assert [h["reward"] for h in resumed["grpo"]] == [h["reward"] for h in full["grpo"]]


# -- issue 41: normalisation as a choice, the std optional, the format gate, 'no spread' without rounding ----------


def test_loss_types_by_hand():
    from llmcourse.post.grpo import normalise_loss

    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[True, True, True], [True, False, False], [False, False, False]])
    assert normalise_loss(per_token, mask, "grpo").item() == pytest.approx((2.0 + 4.0 + 0.0) / 3)
    assert normalise_loss(per_token, mask, "dapo").item() == pytest.approx(10.0 / 4)
    assert normalise_loss(per_token, mask, "dr_grpo").item() == pytest.approx(10.0 / 9)
    assert normalise_loss(per_token, mask, "dr_grpo", max_completion_length=5).item() == pytest.approx(10.0 / 15)
    with pytest.raises(ValueError, match="loss_type"):
        normalise_loss(per_token, mask, "bnpo")


def test_grpo_loss_type_switch_and_errors():
    from llmcourse.post.grpo import grpo_loss

    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(4, 5, generator=g)
    mask = torch.arange(5)[None, :] < torch.tensor([5, 2, 1, 3])[:, None]
    adv = torch.tensor([1.0, -1.0, 0.5, 0.0])
    values = {lt: grpo_loss(lp, lp - 0.1, lp + 0.2, adv, mask, loss_type=lt).item() for lt in ("grpo", "dapo", "dr_grpo")}
    assert len({round(v, 7) for v in values.values()}) == 3
    assert values["grpo"] == grpo_loss(lp, lp - 0.1, lp + 0.2, adv, mask).item()
    with pytest.raises(ValueError, match="loss_type"):
        grpo_loss(lp, lp, lp, adv, mask, loss_type="token")


def test_scale_rewards_options():
    r = torch.tensor([1.1, 0.1, 0.1, 0.1, 0.0, 0.0, 0.0, 0.0, 0.1, 0.1, 0.1, 0.0])
    none = group_relative_advantages(r, 4, scale_rewards="none")
    assert torch.allclose(none[:4], torch.tensor([0.75, -0.25, -0.25, -0.25]), atol=1e-6)
    assert torch.equal(none[4:8], torch.zeros(4))
    batch = group_relative_advantages(r, 4, scale_rewards="batch")
    assert torch.allclose(batch, none / r.std(), atol=1e-6)
    with pytest.raises(ValueError, match="scale_rewards"):
        group_relative_advantages(r, 4, scale_rewards="std")


@pytest.mark.parametrize("value", [0.1, 0.3, 0.7, 1.1])
@pytest.mark.parametrize("G", [6, 7, 8, 16])
def test_one_group_of_equal_rewards_gets_exact_zeros(value, G):
    """One row of equal float32 rewards: torch's std is ~1e-8 for some (value, G), not 0; the advantages are 0."""
    for scale in ("group", "batch", "none"):
        assert torch.equal(group_relative_advantages(torch.full((G,), value), G, scale_rewards=scale), torch.zeros(G))


def test_gate_format_pays_format_only_to_correct_answers():
    assert addition_reward("41<eos>", 42, gate_format=True) == 0.0
    assert addition_reward("42<eos>", 42, gate_format=True) == pytest.approx(1.1)
    assert addition_reward("042<eos>", 42, gate_format=True) == 0.0
    assert addition_reward("41<eos>", 42) == pytest.approx(0.1)


# -- issue 41 item 1: per-item records, sample streams, the exact paired test ----------------------------------------


def _binomial_row(n):
    """Row n of Pascal's triangle by repeated addition (an independent route to the binomial coefficients)."""
    row = [1]
    for _ in range(n):
        row = [a + b for a, b in zip([0] + row, row + [0])]
    return row


@pytest.mark.parametrize("fixed,broken", [(0, 0), (1, 0), (9, 1), (1, 9), (54, 31), (45, 33), (36, 26), (5, 5),
                                          (300, 240)])
def test_mcnemar_exact_is_the_two_sided_binomial_tail(fixed, broken):
    from fractions import Fraction

    from llmcourse.post.run import mcnemar_exact

    n = fixed + broken
    row = _binomial_row(n)
    tail = Fraction(sum(row[: min(fixed, broken) + 1]), 2 ** n)
    assert mcnemar_exact(fixed, broken) == pytest.approx(float(min(Fraction(1), 2 * tail)), rel=1e-12)
    assert mcnemar_exact(fixed, broken) == mcnemar_exact(broken, fixed)


def test_mcnemar_exact_known_values_and_bad_counts():
    from llmcourse.post.run import mcnemar_exact

    assert mcnemar_exact(9, 1) == pytest.approx(2 * 11 / 1024)          # 2·(C(10,0) + C(10,1)) / 2^10
    assert mcnemar_exact(0, 0) == 1.0 and mcnemar_exact(3, 3) == 1.0
    with pytest.raises(ValueError, match="≥ 0"):
        mcnemar_exact(-1, 3)


def test_paired_change_counts_fixed_and_broken_items():
    from llmcourse.post.run import paired_change

    before = [True, True, False, False, False, True]
    after = [True, False, True, True, False, True]
    out = paired_change(before, after)
    assert (out["fixed"], out["broken"]) == (2, 1) and out["gain"] == pytest.approx(1 / 6)
    with pytest.raises(ValueError, match="different lengths"):
        paired_change([True], [True, False])


def test_evaluate_correct_is_the_per_item_record_of_evaluate_accuracy():
    from llmcourse.post import evaluate_correct

    task = AdditionTask(1, n_test=20, seed=0)
    model = tiny_model()
    rec = evaluate_correct(model, task, task.test_pairs, batch_size=7)
    assert rec.dtype == torch.bool and rec.shape == (20,)
    assert evaluate_accuracy(model, task, task.test_pairs) == rec.float().mean().item()
    seqs = generate_cached(model, task.prompts(task.test_pairs), task.max_new_tokens, task.tokenizer.eos_id)
    assert rec.tolist() == task.correct(task.test_pairs, seqs[:, task.prompt_len:]).tolist()


def test_grpo_stream_draws_other_samples_from_the_same_model():
    from llmcourse.post.run import run_post_training

    kw = dict(n_digits=1, n_test=20, sft_steps=3, sft_batch=16, grpo_iters=2, prompts_per_step=2, group_size=4,
              gate_format=False)       # an untrained model is never right: the format term gives the groups spread
    a, a2, b = (run_post_training(0, grpo_stream=s, **kw) for s in (0, 0, 1))
    assert a["acc_sft"] == b["acc_sft"] and a["correct_sft"] == b["correct_sft"]       # the same SFT model
    assert [h["reward"] for h in a["grpo"]] == [h["reward"] for h in a2["grpo"]]      # a stream is reproducible
    pa = torch.cat([p.flatten() for p in a["model"].parameters()])
    pb = torch.cat([p.flatten() for p in b["model"].parameters()])
    assert not torch.equal(pa, pb)                                                    # another stream, another run
    assert len(a["correct_grpo"]) == 20 and sum(a["correct_grpo"]) / 20 == a["acc_grpo"]


def test_stored_grpo_runs_are_consistent_with_their_counts_and_the_recipe():
    from llmcourse.post.run import POST_RECIPE, load_grpo_runs, load_sft_models, mcnemar_exact

    runs = load_grpo_runs()
    sft = load_sft_models(retrain=False)
    assert runs["seeds"] == sft["seeds"] == [0, 1, 2] and len(runs["streams"]) >= 2 and not runs["sft_substitute"]
    assert runs["recipe"]["n_test"] == sft["recipe"]["n_test"]
    assert {k: v for k, v in runs["recipe"].items() if k != "eval_every"} == \
        {k: v for k, v in POST_RECIPE.items() if k not in ("grpo_stream", "eval_every")}
    assert len(runs["runs"]) == len(runs["seeds"]) * len(runs["streams"])
    n = runs["recipe"]["n_test"]
    for row in runs["runs"]:
        assert row["acc_sft"] == pytest.approx(sft["acc_sft"][row["seed"]], abs=1e-12)
        assert row["acc_grpo"] - row["acc_sft"] == pytest.approx((row["fixed"] - row["broken"]) / n, abs=1e-9)
        assert row["p"] == pytest.approx(mcnemar_exact(row["fixed"], row["broken"]), rel=1e-12)


def test_missing_grpo_runs_name_their_command(tmp_path):
    from llmcourse.post.run import load_grpo_runs

    with pytest.raises(FileNotFoundError, match="llmcourse.post.run --store-runs"):
        load_grpo_runs(tmp_path / "absent.json")


def test_grpo_significance_pairs_every_seed_and_stream_with_its_sft_model(tmp_path):
    from llmcourse.post.run import grpo_significance, mcnemar_exact, run_post_training, train_sft_models

    kw = dict(n_digits=1, n_test=20, sft_steps=3, sft_batch=16, prompts_per_step=2, group_size=4)
    sft = train_sft_models([0, 1], verbose=False, **kw)
    out = grpo_significance(sft, streams=(0, 1), verbose=False, grpo_iters=2, **kw)
    assert [(r["seed"], r["stream"]) for r in out["runs"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert out["recipe"]["n_test"] == 20 and "grpo_stream" not in out["recipe"]
    direct = run_post_training(1, sft_state=sft["models"][1], grpo_iters=2, grpo_stream=1, **kw)
    row = out["runs"][3]
    fixed = sum(1 for b, a in zip(direct["correct_sft"], direct["correct_grpo"]) if a and not b)
    broken = sum(1 for b, a in zip(direct["correct_sft"], direct["correct_grpo"]) if b and not a)
    assert (row["fixed"], row["broken"]) == (fixed, broken) and row["acc_grpo"] == direct["acc_grpo"]
    assert row["p"] == mcnemar_exact(fixed, broken) and row["acc_sft"] == sft["acc_sft"][1]
