"""Unit 09 (generation and sampling): temperature, top-k, top-p, sampling and ``generate``.

Oracles: the syllabus's F09.1 numbers (typed here from the specification, never printed by the code under
test), ``torch.topk``, the logits warpers of ``transformers`` (``TopKLogitsWarper``, ``TopPLogitsWarper``:
the same keep rules, written differently), a pure-Python nucleus rule, the binomial standard error for
sampled frequencies, and ``transformers.GPT2LMHeadModel.generate`` (greedy, with and without EOS) for the
generation loop.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from llmcourse.models.attention_lm import AttentionOnlyLM
from llmcourse.train.sampling import (
    apply_temperature,
    entropy,
    filtered_probs,
    generate,
    sample_next_token,
    top_k_filter,
    top_p_filter,
)

Z = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])  # F09.1
INF = float("-inf")


# ---------------------------------------------------------------- F09.1 and the temperature


def test_f091_softmax_cumsum_entropy():
    p = torch.softmax(Z, -1)
    assert torch.allclose(p, torch.tensor([0.5630, 0.2071, 0.1256, 0.0762, 0.0280]), atol=1e-4)
    assert torch.allclose(p.cumsum(-1), torch.tensor([0.5630, 0.7701, 0.8958, 0.9720, 1.0]), atol=1e-4)
    assert abs(float(entropy(p)) - 1.2065) < 1e-4


def test_temperature_f091_and_errors():
    assert torch.equal(apply_temperature(Z, 0.5), Z / 0.5)
    assert torch.allclose(apply_temperature(Z, 0.5).softmax(-1),
                          torch.tensor([0.8292, 0.1122, 0.0413, 0.0152, 0.0021]), atol=1e-4)
    assert torch.allclose(apply_temperature(Z, 2.0).softmax(-1),
                          torch.tensor([0.3745, 0.2272, 0.1769, 0.1378, 0.0836]), atol=1e-4)
    for bad in (0, 0.0, -1.0):
        with pytest.raises(ValueError, match="temperature"):
            apply_temperature(Z, bad)
    with pytest.raises(TypeError):
        apply_temperature(torch.tensor([1, 2]), 1.0)


def test_temperature_keeps_argmax_and_orders_entropy():
    z = torch.randn(6, 40, generator=torch.Generator().manual_seed(0))
    entropies = []
    for t in (0.1, 0.5, 1.0, 2.0, 10.0):
        out = apply_temperature(z, t)
        assert torch.equal(out.argmax(-1), z.argmax(-1))
        entropies.append(entropy(out.softmax(-1)))
    for lo, hi in zip(entropies, entropies[1:]):
        assert bool((lo < hi).all())  # entropy rises with T
    assert bool((entropies[-1] < math.log(40)).all()) and bool((entropies[-1] > 0.95 * math.log(40)).all())


# ---------------------------------------------------------------- top-k


def test_top_k_f091_and_ties():
    out = top_k_filter(Z, 2)
    assert torch.equal(out, torch.tensor([2.0, 1.0, INF, INF, INF]))
    assert torch.allclose(out.softmax(-1), torch.tensor([0.7311, 0.2689, 0, 0, 0]), atol=1e-4)
    tied = top_k_filter(torch.tensor([3.0, 1.0, 1.0, 0.0]), 2)
    assert torch.isfinite(tied).nonzero().flatten().tolist() == [0, 1, 2]


def test_top_k_matches_torch_topk_and_transformers_per_row():
    from transformers.generation.logits_process import TopKLogitsWarper

    g = torch.Generator().manual_seed(1)
    z = torch.randn(5, 30, generator=g) * torch.tensor([[0.1], [1.0], [10.0], [100.0], [3.0]])
    for k in (1, 3, 17, 29):
        vals, ids = torch.topk(z, k, dim=-1)
        expected = torch.full_like(z, INF).scatter(-1, ids, vals)
        out = top_k_filter(z, k)
        assert torch.equal(out, expected)
        assert torch.equal(out, TopKLogitsWarper(k)(None, z.clone()))
        for b in range(5):  # per row: the same as filtering the row alone
            assert torch.equal(out[b], top_k_filter(z[b], k))


def test_top_k_off_and_shapes_and_no_inplace():
    z = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(2))
    before = z.clone()
    for k in (None, 7, 100):
        out = top_k_filter(z, k)
        assert torch.equal(out, z) and out is not z
    assert top_k_filter(z, 2).shape == (2, 3, 7)
    assert int(torch.isfinite(top_k_filter(z, 2)).sum()) == 2 * 3 * 2
    assert torch.equal(z, before)
    for bad in (0, -1):
        with pytest.raises(ValueError, match="top_k"):
            top_k_filter(z, bad)


# ---------------------------------------------------------------- top-p


def _nucleus_oracle(row: list[float], p: float) -> list[bool]:
    """Keep rule in plain Python (double precision): stable descending order, mass before < p."""
    m = max(row)
    e = [math.exp(x - m) if x != INF else 0.0 for x in row]
    s = sum(e)
    probs = [x / s for x in e]
    order = sorted(range(len(row)), key=lambda i: -probs[i])  # Python's sort is stable
    keep, before = [False] * len(row), 0.0
    for i in order:
        keep[i] = before < p
        before += probs[i]
    return keep


@pytest.mark.parametrize(("p", "expected"), [
    (0.5, [1.0, 0, 0, 0, 0]),
    (0.6, [0.7311, 0.2689, 0, 0, 0]),
    (0.8, [0.6285, 0.2312, 0.1402, 0, 0]),
    (0.9, [0.5793, 0.2131, 0.1293, 0.0784, 0]),
])
def test_top_p_f091(p, expected):
    out = top_p_filter(Z, p)
    assert torch.allclose(out.softmax(-1), torch.tensor(expected), atol=1e-4)
    kept = torch.isfinite(out)
    assert torch.equal(out[kept], Z[kept])  # kept logits untouched


def test_top_p_exact_threshold_and_stable_ties():
    # uniform over 4: the mass before the third token is exactly 0.5, so p = 0.5 keeps two tokens
    u = torch.zeros(4)
    assert torch.isfinite(top_p_filter(u, 0.5)).tolist() == [True, True, False, False]
    assert int(torch.isfinite(top_p_filter(u, 0.5001)).sum()) == 3
    assert int(torch.isfinite(top_p_filter(torch.zeros(8), 0.25)).sum()) == 2
    assert int(torch.isfinite(top_p_filter(torch.zeros(8), 0.75)).sum()) == 6
    # many ties across a large vocabulary: equal probabilities keep their vocabulary order
    z = torch.zeros(256)
    z[::7] = 2.0
    out = top_p_filter(z, 0.5)
    keep = _nucleus_oracle(z.tolist(), 0.5)
    assert torch.isfinite(out).tolist() == keep


def test_top_p_matches_oracles_on_random_rows():
    from transformers.generation.logits_process import TopPLogitsWarper

    g = torch.Generator().manual_seed(3)
    z = torch.randn(16, 50, generator=g) * torch.linspace(0.2, 5.0, 16)[:, None]
    for p in (0.05, 0.3, 0.5, 0.75, 0.9, 0.99):
        out = top_p_filter(z, p)
        for b in range(z.shape[0]):
            assert torch.isfinite(out[b]).tolist() == _nucleus_oracle(z[b].tolist(), p), (p, b)
        assert torch.equal(out, TopPLogitsWarper(p)(None, z.clone()))
        probs = z.softmax(-1)
        kept = torch.isfinite(out)
        mass = (probs * kept).sum(-1)
        assert bool((mass >= p - 1e-6).all())                  # the kept mass reaches p
        smallest = torch.where(kept, probs, torch.ones_like(probs)).min(-1).values
        assert bool((mass - smallest < p + 1e-6).all())        # and no kept token is superfluous
        assert bool((kept.sum(-1) >= 1).all())


def test_top_p_original_order_after_top_k_and_off():
    perm = torch.tensor([3, 0, 4, 1, 2])
    zp = Z[perm]
    assert torch.equal(top_p_filter(zp, 0.8), top_p_filter(Z, 0.8)[perm])
    after_k = top_p_filter(top_k_filter(Z, 2), 0.6)             # renormalised over the two survivors
    assert torch.equal(after_k, torch.tensor([2.0, INF, INF, INF, INF]))
    for p in (None, 1.0, 1.5):
        assert torch.equal(top_p_filter(Z, p), Z)
    assert torch.equal(top_p_filter(Z, 1e-9), torch.tensor([2.0, INF, INF, INF, INF]))
    x = torch.randn(2, 3, 9, generator=torch.Generator().manual_seed(4))
    before = x.clone()
    y = top_p_filter(x, 0.7)
    assert y.shape == x.shape and torch.equal(x, before)
    for b in range(2):
        for t in range(3):
            assert torch.equal(y[b, t], top_p_filter(x[b, t], 0.7))
    # p = 0 keeps the most likely token alone (the top-1 always survives, as transformers' min_tokens_to_keep=1),
    # independently computed: the argmax of each row
    zero = top_p_filter(x, 0.0)
    assert torch.equal(torch.isfinite(zero), torch.nn.functional.one_hot(x.argmax(-1), 9).bool())
    with pytest.raises(ValueError, match="top_p"):
        top_p_filter(Z, -0.1)


# ---------------------------------------------------------------- sampling


def _frequencies(samples: torch.Tensor, v: int) -> torch.Tensor:
    return torch.bincount(samples.flatten(), minlength=v).double() / samples.numel()


@pytest.mark.parametrize(("temperature", "top_k", "top_p", "expected"), [
    (1.0, None, None, [0.5630, 0.2071, 0.1256, 0.0762, 0.0280]),
    (0.5, None, None, [0.8292, 0.1122, 0.0413, 0.0152, 0.0021]),
    (2.0, None, None, [0.3745, 0.2272, 0.1769, 0.1378, 0.0836]),
    (1.0, 2, None, [0.7311, 0.2689, 0, 0, 0]),
    (1.0, None, 0.8, [0.6285, 0.2312, 0.1402, 0, 0]),
    (1.0, 2, 0.6, [1.0, 0, 0, 0, 0]),                            # top-k first, then top-p on the survivors
])
def test_sampled_frequencies_match_the_filtered_distribution(temperature, top_k, top_p, expected):
    n = 20_000
    out = sample_next_token(Z.expand(n, 5), temperature, top_k, top_p, torch.Generator().manual_seed(0))
    assert out.shape == (n, 1) and out.dtype == torch.long
    freq, p = _frequencies(out, 5), torch.tensor(expected, dtype=torch.double)
    se = (p * (1 - p) / n).sqrt()
    assert bool(((freq - p).abs() <= 4 * se + 1e-4).all()), (freq, p)
    assert bool((freq[p == 0] == 0).all())                     # support is exact
    assert torch.allclose(filtered_probs(Z, temperature, top_k, top_p).double(), p, atol=1e-4)


def test_sampling_uses_the_generator_and_one_multinomial_call():
    z = torch.randn(64, 11, generator=torch.Generator().manual_seed(5))
    torch.manual_seed(1)
    a = sample_next_token(z, 0.8, 6, 0.9, torch.Generator().manual_seed(7))
    torch.manual_seed(2)
    b = sample_next_token(z, 0.8, 6, 0.9, torch.Generator().manual_seed(7))
    assert torch.equal(a, b)
    probs = torch.softmax(top_p_filter(top_k_filter(z / 0.8, 6), 0.9), -1)
    assert torch.equal(a, torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(7)))


def test_temperature_zero_is_argmax_and_ignores_filters():
    z = torch.randn(9, 13, generator=torch.Generator().manual_seed(6))
    g = torch.Generator().manual_seed(0)
    state = g.get_state()
    out = sample_next_token(z, 0.0, top_k=1, top_p=1e-3, generator=g)
    assert torch.equal(out, z.argmax(-1, keepdim=True))
    assert torch.equal(g.get_state(), state)                  # greedy draws no random number
    assert torch.equal(filtered_probs(z, 0.0), nn.functional.one_hot(z.argmax(-1), 13).float())
    with pytest.raises(ValueError):
        sample_next_token(z, -0.5)
    with pytest.raises(ValueError, match=r"\(B, V\)"):
        sample_next_token(z[None], 1.0)


# ---------------------------------------------------------------- generate


def _tiny_lm(context=8, vocab=11, dropout=0.0, seed=0):
    torch.manual_seed(seed)
    return AttentionOnlyLM(vocab, 16, context, dropout=dropout).eval()


def _greedy_by_hand(model, idx, n, context):
    for _ in range(n):
        logits = model(idx[:, -context:])
        idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], 1)
    return idx


def test_generate_greedy_crops_and_keeps_prompt():
    model = _tiny_lm()
    idx = torch.randint(0, 11, (3, 13), generator=torch.Generator().manual_seed(0))  # T0 > context_length
    with torch.no_grad():
        expected = _greedy_by_hand(model, idx, 9, 8)
    out = generate(model, idx, 9, context_length=8)
    assert out.shape == (3, 22) and out.dtype == torch.long and torch.equal(out, expected)
    # a smaller window than the model's own: the argument is what counts
    with torch.no_grad():
        assert torch.equal(generate(model, idx, 5, context_length=3), _greedy_by_hand(model, idx, 5, 3))
    with pytest.raises(ValueError, match="exceeds"):              # the model itself refuses a longer input
        model(idx)
    assert torch.equal(generate(model, idx, 0, 8), idx)


def _hf_model(seed=0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=23, n_positions=32, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None)
    hf = GPT2LMHeadModel(cfg).eval()
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = None
    return hf


class _Logits(nn.Module):
    def __init__(self, hf):
        super().__init__()
        self.hf = hf

    def forward(self, idx):
        return self.hf(idx).logits


def test_generate_greedy_and_eos_match_transformers():
    hf = _hf_model()
    idx = torch.randint(0, 23, (4, 5), generator=torch.Generator().manual_seed(1))
    ours = generate(_Logits(hf), idx, 12, context_length=32)
    theirs = hf.generate(idx, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(ours, theirs)
    # EOS: pick a token that some rows produce early; HF pads finished rows with pad_token_id = eos_id
    eos = int(ours[0, 7])
    ours = generate(_Logits(hf), idx, 12, context_length=32, eos_id=eos)
    theirs = hf.generate(idx, max_new_tokens=12, do_sample=False, eos_token_id=eos, pad_token_id=eos)
    assert torch.equal(ours, theirs)
    new = ours[:, 5:]
    for row in new.tolist():
        if eos in row:
            first = row.index(eos)
            assert all(t == eos for t in row[first:])


class _Counter(nn.Module):
    """Next token = (current token + 1) mod V at every position: the EOS step of each row is known."""

    def __init__(self, vocab=10):
        super().__init__()
        self.vocab = vocab

    def forward(self, idx):
        return 5.0 * nn.functional.one_hot((idx + 1) % self.vocab, self.vocab).float()


def test_generate_freezes_finished_rows_and_stops_when_all_have():
    idx = torch.tensor([[0, 7], [0, 4], [0, 8]])                 # rows reach 9 after 2, 5 and 1 steps
    out = generate(_Counter(), idx, 30, context_length=4, eos_id=9)
    assert out.tolist() == [[0, 7, 8, 9, 9, 9, 9], [0, 4, 5, 6, 7, 8, 9], [0, 8, 9, 9, 9, 9, 9]]
    short = generate(_Counter(), idx, 3, context_length=4, eos_id=9)     # max_new_tokens reached first
    assert short.tolist() == [[0, 7, 8, 9, 9], [0, 4, 5, 6, 7], [0, 8, 9, 9, 9]]
    assert generate(_Counter(), idx, 6, 4).tolist()[1] == [0, 4, 5, 6, 7, 8, 9, 0]  # no eos_id: no stop


def test_generate_eval_mode_inside_and_mode_restored():
    model = _tiny_lm(dropout=0.5, seed=4).train()
    idx = torch.randint(0, 11, (4, 6), generator=torch.Generator().manual_seed(3))
    a = generate(model, idx, 20, 8)
    b = generate(model, idx, 20, 8)
    assert torch.equal(a, b) and model.training
    model.eval()
    generate(model, idx, 3, 8)
    assert not model.training

    class Boom(nn.Module):
        def forward(self, idx):
            raise RuntimeError("boom")

    boom = Boom().train()
    with pytest.raises(RuntimeError):
        generate(boom, idx, 2, 8)
    assert boom.training


def test_generate_sampling_stays_in_top_k_and_is_reproducible():
    model = _tiny_lm(vocab=11, seed=5)
    idx = torch.randint(0, 11, (3, 4), generator=torch.Generator().manual_seed(4))
    out = generate(model, idx, 10, 8, temperature=1.3, top_k=3, generator=torch.Generator().manual_seed(9))
    again = generate(model, idx, 10, 8, temperature=1.3, top_k=3, generator=torch.Generator().manual_seed(9))
    assert torch.equal(out, again)
    with torch.no_grad():
        for t in range(4, out.shape[1]):
            top3 = model(out[:, max(0, t - 8):t])[:, -1].topk(3, -1).indices
            assert bool((top3 == out[:, t:t + 1]).any(-1).all())
    greedy = generate(model, idx, 10, 8)
    assert torch.equal(generate(model, idx, 10, 8, temperature=1.0, top_k=1), greedy)


def test_generate_rejects_bad_arguments():
    model = _tiny_lm()
    with pytest.raises(ValueError, match="idx"):
        generate(model, torch.zeros(5, dtype=torch.long), 2, 8)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, torch.zeros(1, 2, dtype=torch.long), -1, 8)
    with pytest.raises(ValueError, match="context_length"):
        generate(model, torch.zeros(1, 2, dtype=torch.long), 1, 0)


# ---------------------------------------------------------------- widgets (compute functions and rendering)


@pytest.fixture(scope="module")
def char_lm():
    from llmcourse.data.tokenizers import CharTokenizer
    from llmcourse.models.gpt2 import GPT2Config, GPT2Model

    chars = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(chars), context_length=32, d_model=32, n_heads=2, n_layers=2, dropout=0.0)
    model = GPT2Model(cfg).eval()
    with torch.no_grad():  # spread the logits so that filters matter
        model.lm_head.weight.mul_(20)
    return model, CharTokenizer(list(chars))


def test_next_token_view_matches_a_direct_forward(char_lm):
    from llmcourse.viz import generation as G

    model, tok = char_lm
    prompt = "ROMEO: a very long prompt that is longer than the window of thirty-two"
    ids = torch.tensor([tok.encode(prompt)])[:, -32:]
    with torch.no_grad():
        logits = model(ids)[0, -1]
    p = torch.softmax(logits, -1)
    view = G.next_token_view(model, tok, prompt, temperature=0.7, top_k=8, top_p=0.9)
    order = torch.sort(p, descending=True, stable=True).indices[:20]
    assert torch.equal(view["ids"], order)
    assert torch.allclose(view["model_probs"], p[order])
    sampling = torch.softmax(top_p_filter(top_k_filter(logits / 0.7, 8), 0.9), -1)
    assert torch.allclose(view["sampling_probs"], sampling[order])
    assert view["n_kept"] == int((sampling > 0).sum()) and 1 <= view["n_kept"] <= 8
    assert view["greedy"] == int(logits.argmax()) and abs(view["top_mass"] - float(p[order].sum())) < 1e-6
    assert abs(view["entropy_model"] - float(-(p * p.log()).sum())) < 1e-5
    greedy = G.next_token_view(model, tok, prompt, temperature=0.0)
    assert greedy["n_kept"] == 1 and greedy["entropy_sampling"] == 0.0
    assert G.next_token_view(model, tok, prompt, top_k=0)["n_kept"] == len(tok.chars)  # 0 = off
    assert G.display_token("\n") == "⏎" and G.display_token(" ") == "␣"
    with pytest.raises(ValueError, match="prompt"):
        G.next_token_view(model, tok, "")


def test_temperature_sweep_nll_by_an_independent_route(char_lm):
    from llmcourse.viz import generation as G

    model, tok = char_lm
    rows = G.temperature_sweep(model, tok, "ROMEO:", (0.2, 2.0), n_tokens=40, seed=3)
    assert [r["temperature"] for r in rows] == [0.2, 2.0]
    for r in rows:
        full = torch.tensor([tok.encode("ROMEO:" + r["text"])])
        assert full.shape[1] == 46
        nll = 0.0
        with torch.no_grad():
            for t in range(6, 46):
                window = full[:, max(0, t - 32):t]
                nll -= float(torch.log_softmax(model(window)[0, -1], -1)[full[0, t]])
        assert abs(r["nll"] - nll / 40) < 1e-4
        grams = {r["text"][i:i + 4] for i in range(37)}
        assert abs(r["distinct"] - len(grams) / 37) < 1e-9
    again = G.temperature_sweep(model, tok, "ROMEO:", (0.2, 2.0), n_tokens=40, seed=3)
    assert [r["text"] for r in again] == [r["text"] for r in rows]  # seeded


def test_generation_steps_follow_generate_with_a_small_window(char_lm):
    from llmcourse.viz import generation as G

    model, tok = char_lm
    steps = G.generation_steps(model, tok, "ROMEO:", n_steps=7, window=4)
    out = generate(model, torch.tensor([tok.encode("ROMEO:")]), 7, context_length=4)
    assert [s["next"] for s in steps] == out[0, 6:].tolist()
    for k, s in enumerate(steps):
        assert len(s["sequence"]) == 6 + k and s["start"] == 6 + k - 4
        with torch.no_grad():
            p = torch.softmax(model(torch.tensor([s["sequence"]])[:, -4:])[0, -1], -1)
        assert s["alternatives"][0][0] == s["next"]                      # greedy: the model's top token
        assert abs(s["p_next"] - float(p[s["next"]])) < 1e-6
    with pytest.raises(ValueError, match="window"):
        G.generation_steps(model, tok, "ROMEO:", window=33)


def test_widgets_render_static_and_live(char_lm):
    from llmcourse.viz import generation as G
    from llmcourse.viz.base import StaticFigure

    model, tok = char_lm
    for fig, wid in ((G.show_next_token_explorer(model, tok, static=True), "W09.1"),
                     (G.show_temperature_sweep(model, tok, n_tokens=30, static=True), "W09.2"),
                     (G.show_generation_stepper(model, tok, static=True), "W09.3")):
        assert isinstance(fig, StaticFigure) and fig.widget_id == wid
        assert fig._repr_png_().startswith(b"\x89PNG") and wid in fig._repr_html_()
    live = G.show_next_token_explorer(model, tok, prompt="ROMEO:", static=False)
    assert "llmcourse-w09-1" in live._dom_classes
    box = live.children[0]
    buttons, status = live.children[1].children[1].children
    sample_btn, append_btn = buttons.children
    assert (sample_btn.description, append_btn.description) == ("sample", "append")
    sample_btn.click()
    assert "drawn" in status.value
    append_btn.click()
    assert box.value.startswith("ROMEO:") and len(box.value) == 7
    stepper = G.show_generation_stepper(model, tok, static=False, n_steps=6)
    stepper.children[0].children[0].value = 5  # move the step slider
    assert "llmcourse-w09-3" in stepper._dom_classes
    assert "llmcourse-w09-2" in G.show_temperature_sweep(model, tok, n_tokens=20, static=False)._dom_classes


def test_grader_oracles_agree_with_the_worked_example_and_the_library():
    from grader.checks import u09_generation as K

    typed = [K.F091_SOFTMAX, K.F091_T05, K.F091_T2, K.F091_TOPK2, K.F091_TOPP[0.8]]
    for (kw, _label), want in zip(K.SAMPLING_CASES, typed):
        got = K._expected_probs(K.Z, kw["temperature"], kw.get("top_k"), kw.get("top_p"))
        assert torch.allclose(got.float(), torch.tensor(want), atol=1e-4)
    for kw, _label in K.SAMPLING_CASES:
        got = K._expected_probs(K.Z, kw["temperature"], kw.get("top_k"), kw.get("top_p"))
        assert torch.allclose(got.float(), filtered_probs(K.Z, kw["temperature"], kw.get("top_k"), kw.get("top_p")),
                              atol=1e-6)
    batch = torch.tensor([[0, 7], [0, 4], [0, 8], [3, 2]])
    free = K._greedy_counter(batch, 30)
    assert torch.equal(free, generate(K._Counter(10), batch, 30, 4))
    assert torch.equal(K._freeze_after_eos(free, 2, 9), generate(K._Counter(10), batch, 30, 4, eos_id=9))


def test_lesson_markdown_cells_are_whole_and_spot_the_bug_headings_start_their_cells():
    """Every line of a markdown cell in the lesson source is commented (an uncommented ``###`` line once
    rendered the top-20 heading inside the reference-fix cell), and in the built lesson every "Spot the bug"
    heading opens a cell that holds no reference fix."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for slug in ("08_gpt2_model", "09_generation", "10_gpt2_pretraining"):
        lines = (root / "notebooks" / "lessons" / f"{slug}.py").read_text().splitlines()
        in_md = False
        for n, line in enumerate(lines, 1):
            if line.startswith("# %%"):
                in_md = "[markdown]" in line
            elif in_md and line.strip():
                assert line.startswith("#"), f"{slug}.py line {n}: uncommented line in a markdown cell: {line!r}"
        nb = json.loads((root / "lessons" / f"{slug}.ipynb").read_text())
        for cell in nb["cells"]:
            src = "".join(cell["source"])
            if "### Spot the bug" in src:
                assert cell["cell_type"] == "markdown" and "Reference" not in src.split("### Spot the bug")[0], slug


# ---------------------------------------------------------------- left-padded batched generation


def _tiny_gpt2_pair(seed: int = 0):
    """A seeded random ``transformers`` GPT-2 and the course's GPT2Model with the same weights."""
    from llmcourse.models.gpt2 import GPT2Config, GPT2Model, load_hf_gpt2, random_hf_gpt2

    cfg = GPT2Config(vocab_size=97, context_length=40, d_model=64, n_heads=4, n_layers=2, dropout=0.0)
    hf = random_hf_gpt2(cfg, seed=seed).eval()
    ours = GPT2Model(cfg)
    load_hf_gpt2(ours, hf.state_dict())
    return hf, ours.eval()


BATCH = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17], [18]]


def test_gpt2_forward_default_path_is_unchanged():
    """forward(idx) with no mask and no positions is the plain computation, bit for bit (units 08, 10, 17 use it)."""
    from llmcourse.models.gpt2 import GPT2Config, GPT2Model

    torch.manual_seed(0)
    m = GPT2Model(GPT2Config.preset("gpt2-char-tiny")).eval()
    idx = torch.randint(0, 65, (3, 20))
    with torch.no_grad():
        x = m.tok_emb(idx) + m.pos_emb(torch.arange(20))
        for block in m.blocks:
            x = x + block.attn(block.norm1(x))
            x = x + block.ffn(block.norm2(x))
        plain = m.lm_head(m.final_norm(x))
        assert torch.equal(m(idx), plain)
        assert torch.equal(m(idx, None, None), plain)
        assert torch.equal(m.hidden_states(idx)[-1], x)


def test_padded_batch_layout_and_positions():
    from llmcourse.train.sampling import padded_batch

    idx, mask, pos = padded_batch(BATCH, pad_id=3)
    assert idx.shape == mask.shape == pos.shape == (4, 7)
    assert idx[1].tolist() == [3, 3, 3, 3, 3, 12, 13] and mask[1].tolist() == [False] * 5 + [True] * 2
    assert pos[1].tolist() == [0, 0, 0, 0, 0, 0, 1] and pos[0].tolist() == list(range(7))
    for row, p in enumerate(BATCH):  # each row's real tokens sit at 0 … len−1, in the last columns
        assert idx[row, mask[row]].tolist() == p and pos[row, mask[row]].tolist() == list(range(len(p)))
    r_idx, r_mask, r_pos = padded_batch(BATCH, side="right")
    assert r_idx[1].tolist() == [12, 13, 0, 0, 0, 0, 0] and r_pos[1].tolist() == [0, 1, 1, 1, 1, 1, 1]
    with pytest.raises(ValueError):
        padded_batch([[1], []])
    with pytest.raises(ValueError):
        padded_batch(BATCH, side="middle")


def test_padded_forward_matches_transformers_and_each_prompt_alone():
    from llmcourse.train.sampling import padded_batch

    hf, ours = _tiny_gpt2_pair()
    idx, mask, pos = padded_batch(BATCH)
    with torch.no_grad():
        theirs = hf(input_ids=idx, attention_mask=mask.long(), position_ids=pos).logits
        mine = ours(idx, attention_mask=mask, position_ids=pos)
        assert torch.isfinite(mine).all()  # padded queries see themselves: no empty softmax row
        assert torch.allclose(mine[mask], theirs[mask], atol=1e-5, rtol=1e-5)
        for row, p in enumerate(BATCH):
            alone = ours(torch.tensor([p]))[0]
            assert torch.allclose(mine[row, mask[row]], alone, atol=1e-5, rtol=1e-5)
        # what the three decisions buy: without the mask, or with positions counted from the pad, rows drift
        unmasked = ours(idx, position_ids=pos)
        from_pad = ours(idx, attention_mask=mask)
        short = mask.clone()
        short[0] = False  # row 0 has no padding: it is unaffected either way
        for wrong in (unmasked, from_pad):
            assert (wrong[short] - mine[short]).abs().max() > 1e-2


def test_generate_batched_equals_one_by_one_and_transformers_generate():
    from llmcourse.train.sampling import generate_batched, padded_batch

    hf, ours = _tiny_gpt2_pair(seed=1)
    out = generate_batched(ours, BATCH, 12, 40)
    assert out.shape == (4, 12) and out.dtype == torch.long
    for row, p in enumerate(BATCH):
        assert torch.equal(out[row], generate(ours, torch.tensor([p]), 12, 40)[0, len(p):])
    idx, mask, _ = padded_batch(BATCH)
    theirs = hf.generate(input_ids=idx, attention_mask=mask.long(), max_new_tokens=12, do_sample=False,
                         pad_token_id=0, eos_token_id=None)
    assert torch.equal(out, theirs[:, idx.shape[1]:])
    assert torch.equal(generate_batched(ours, BATCH, 12, 40, pad_id=50), out)  # the pad id never matters


def test_generate_batched_eos_sampling_modes_and_errors():
    from llmcourse.train.sampling import generate_batched

    _, ours = _tiny_gpt2_pair(seed=1)
    free = generate_batched(ours, BATCH, 12, 40)
    eos = int(free[0, 2])
    out = generate_batched(ours, BATCH, 12, 40, eos_id=eos)
    for row in range(4):
        r = out[row].tolist()
        if eos in r:
            assert all(v == eos for v in r[r.index(eos):])
            assert r[:r.index(eos)] == free[row, :r.index(eos)].tolist()
    a = generate_batched(ours, BATCH, 8, 40, temperature=1.0, top_k=3, generator=torch.Generator().manual_seed(0))
    b = generate_batched(ours, BATCH, 8, 40, temperature=1.0, top_k=3, generator=torch.Generator().manual_seed(0))
    assert torch.equal(a, b)
    with torch.no_grad():
        for row, p in enumerate(BATCH):
            seq = torch.tensor([p + a[row].tolist()])
            top3 = ours(seq[:, :-1]).topk(3, dim=-1).indices[0, len(p) - 1:]
            assert all(int(a[row, i]) in top3[i].tolist() for i in range(8))
    ours.train()
    assert torch.equal(generate_batched(ours, BATCH, 4, 40), free[:, :4]) and ours.training
    assert generate_batched(ours, BATCH, 0, 40).shape == (4, 0)
    with pytest.raises(ValueError):
        generate_batched(ours, BATCH, 34, 40)   # 7 + 34 > 40
    with pytest.raises(ValueError):
        ours(torch.zeros(1, 3, dtype=torch.long), position_ids=torch.tensor([[0, 1, 40]]))
    with pytest.raises(ValueError):
        ours(torch.zeros(1, 3, dtype=torch.long), attention_mask=torch.ones(1, 4, dtype=torch.bool))


def test_generate_batched_mutants_differ_from_one_by_one():
    """Each catalogued mistake of the batched exercise changes the tokens (so the check can tell it apart)."""
    from grader.bugs.u09_generation import _batched_variant

    _, ours = _tiny_gpt2_pair(seed=1)
    expected = torch.stack([generate(ours, torch.tensor([p]), 10, 40)[0, len(p):] for p in BATCH])
    assert torch.equal(_batched_variant("none")(ours, BATCH, 10, 40), expected)
    for variant in ("right_pad", "positions_from_pad", "no_mask", "mask_not_extended"):
        assert not torch.equal(_batched_variant(variant)(ours, BATCH, 10, 40), expected), variant
