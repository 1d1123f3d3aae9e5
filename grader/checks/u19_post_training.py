"""Checks of unit 19 (post-training: the rule-based reward, masked SFT, GRPO's pieces).

Independent routes, all written here and never through ``llmcourse.post``: the reward from ``str.isdigit`` and an
``int``/``str`` round trip; the SFT loss as a float64 Python loop over ``(row, position)`` pairs (its gradient by
autograd through that loop); the advantages from :func:`statistics.mean` / :func:`statistics.stdev` per group;
per-token log-probabilities from a prefix-by-prefix forward of unit 11's Llama (the model reads ``seq[:, :p]`` and
its last position scores token ``p``); the GRPO loss as a float64 loop over the formula of DeepSeekMath eq. 3 with
the k3 estimator written from its definition (``r − log r − 1``, ``r = π_ref/π_θ``), its gradient by autograd
through that loop.

Contract clauses and the probes that cover them (what is not listed is not graded):

* ``19.addition_reward``: four groups compared one by one (so that a failure names its clause): well-formed answers
  right and wrong (a wrong one holding the sum as a substring); cut-off (no ``<eos>``); not a plain number (leading
  zeros, ``0``, empty, a sign, a space, a digit separator, other tokens); text after the first ``<eos>``; at the
  default and at other ``correct_weight`` and ``format_weight``; a Python float.
* ``19.sft_loss``: the task's batch with answers of 1, 2 and 3 digits (padding of different lengths), value and
  gradient (zero at every logit that predicts a prompt token or padding); a synthetic batch with another
  ``prompt_len`` and ``pad_id``; one mean over tokens (rows weigh by their answer length); ``ValueError`` on
  mismatched shapes.
* ``19.group_relative_advantages``: the stated evidence ``[1.1, 0.1, 0.1, 0.1]``; 6 groups of 4 with spread, no
  spread and a constant 0 group; groups of 3 and of 2; groups of 8, one per call, of equal rewards whose float32 mean is not
  exactly their value (a std of ~1e-8, not 0); no NaN/inf; ``ValueError`` for 2-D rewards, ``group_size < 2`` and a
  size that is not a multiple of it.
* ``19.per_token_logps``: a random tiny Llama on three prompt lengths (1 included), against the prefix-by-prefix forward; shape
  ``(N, T − prompt_len)``; gradients reach the parameters; one model call (a forward pre-hook counts them); a
  peaked output layer (log-probabilities to about −190: finite, though below float32's smallest probability);
  ``ValueError`` for ``prompt_len`` 0 and ``T``.
* ``19.grpo_loss``: ratios inside and outside the clip range on both sides, positive and negative advantages, rows of
  different lengths and one empty row, value and gradient with the defaults and at ``clip_eps=0.1, beta=0.3``; no
  gradient reaches ``old_logps`` or ``ref_logps``; ``ValueError`` on mismatched shapes.
* ``19.grpo_update``: 8 fixed samples in 2 groups of 4, rows of different lengths; the losses returned and the
  policy's parameters after 1, 2 and 3 SGD steps (so the ratio leaves the clip range from the second step on), the
  last at ``clip_eps=0.1, beta=0.3``; the reference unchanged and without gradients; ``ValueError`` for
  ``inner_steps=0``. The learner's function runs on the course's own ``group_relative_advantages``,
  ``per_token_logps`` and ``grpo_loss`` (bound into its globals by the probe), so that a mistake there costs
  that exercise only.
"""

from __future__ import annotations

import functools
import statistics

import torch

from ..core import CheckFailure, check
from ..runner import also_blocked
from ..strength import decision, defining_property

U = "19"


def _ref_reward():
    from llmcourse.post.task import addition_reward

    return {"addition_reward": addition_reward}


def _ref_sft():
    from llmcourse.post.sft import sft_loss

    return {"sft_loss": sft_loss}


def _ref_adv():
    from llmcourse.post.grpo import group_relative_advantages

    return {"group_relative_advantages": group_relative_advantages}


def _ref_logps():
    from llmcourse.post.grpo import per_token_logps

    return {"per_token_logps": per_token_logps}


def _ref_loss():
    from llmcourse.post.grpo import grpo_loss

    return {"grpo_loss": grpo_loss}


def _shape(x) -> str:
    return str(tuple(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__


# ================================================================== 19.addition_reward

# the cases, grouped by the clause of the contract they test (each group compared on its own, so that a failure
# names the clause)
REWARD_GROUPS = [
    ("well-formed answers, right and wrong", [("42<eos>", 42), ("41<eos>", 42), ("0<eos>", 0), ("198<eos>", 198),
                                              ("1980<eos>", 198), ("100<eos>", 100), ("10<eos>", 100)]),
    ("completions cut off before any <eos> (not well-formed)", [("42", 42), ("99", 99), ("7", 3)]),
    ("answers that are not a number written without leading zeros (not well-formed)",
     [("042<eos>", 42), ("00<eos>", 0), ("<eos>", 0), ("4+2<eos>", 6), ("7<pad><eos>", 7), (" 42<eos>", 42),
      ("4 2<eos>", 42), ("+42<eos>", 42), ("4_2<eos>", 42)]),
    ("text after the first <eos> (it is not part of the answer)",
     [("42<eos>17<eos>", 42), ("42<eos><eos><eos>", 42), ("<eos>42<eos>", 42), ("4<eos>2", 42), ("4<eos>2<eos>", 42)]),
]
REWARD_CASES = [c for _, cases in REWARD_GROUPS for c in cases]


def _oracle_reward(completion: str, answer: int, correct_weight: float = 1.0, format_weight: float = 0.1) -> float:
    if "<eos>" not in completion:
        return 0.0
    head = completion[: completion.index("<eos>")]
    ok = head.isascii() and head.isdigit() and str(int(head)) == head
    if not ok:
        return 0.0
    return format_weight + (correct_weight if int(head) == answer else 0.0)


def _named_reward_mistake(group: int, got, cases, weights) -> str | None:
    """The catalogued mistake a failing group of rewards shows, when the bug catalog's mutants did not match."""
    cw, fw = weights.get("correct_weight", 1.0), weights.get("format_weight", 0.1)
    paid = [(g, c, a) for g, (c, a) in zip(got, cases) if isinstance(g, (int, float))]
    if group == 0 and any(_oracle_reward(c, a) < 1.0 and str(a) in c and g >= cw - 1e-6 for g, c, a in paid):
        return "B19.sum_found_in_text"
    if group == 1 and any(g >= cw - 1e-6 for g, c, a in paid):
        return "B19.correct_without_format"
    if group == 2 and any(g >= min(fw, cw) - 1e-6 for g, c, a in paid):
        return "B19.lax_format"
    if group == 3:
        return "B19.reads_past_eos"
    return None


@check(f"{U}.addition_reward", ["addition_reward"], _ref_reward)
def check_addition_reward(t):
    first = t.run(lambda impl: impl.addition_reward("42<eos>", 42))
    t.expect(isinstance(first, float), f"addition_reward must return a Python float; got {type(first).__name__}")
    for weights in ({}, {"correct_weight": 2.0, "format_weight": 0.5}):
        for group, (what, cases) in enumerate(REWARD_GROUPS):
            probe = functools.partial(lambda impl, cases, w: [impl.addition_reward(c, a, **w) for c, a in cases],
                                      cases=cases, w=weights)
            label = (f"rewards of {what}: " + ", ".join(repr(c) for c, _ in cases)
                     + (" (with the defaults)" if not weights else " with correct_weight=2.0, format_weight=0.5"))
            want = [_oracle_reward(c, a, **weights) for c, a in cases]
            try:
                t.compare(probe, want, label, atol=1e-6)
            except CheckFailure as failure:
                named = None if failure.bug_id else _named_reward_mistake(group, t.run(probe), cases, weights)
                if named is None:
                    raise
                raise CheckFailure(failure.message, bug_id=named) from None


# ================================================================== 19.sft_loss


def _task_batch():
    """Prompts of 2-digit additions with answers of 1, 2 and 3 digits, right-padded with <pad> (id 0)."""
    from llmcourse.post.task import AdditionTask

    task = AdditionTask(2, 10, 0)
    tok = task.tokenizer
    pairs = [(0, 0), (7, 35), (99, 99), (50, 50), (3, 4)]
    rows = [tok.encode(task.prompt_text(a, b) + task.answer_text(a, b)) for a, b in pairs]
    T = max(len(r) for r in rows)
    ids = torch.tensor([r + [tok.pad_id] * (T - len(r)) for r in rows])
    logits = torch.randn(len(rows), T, tok.vocab_size, generator=torch.Generator().manual_seed(190)) * 2
    return ids, logits, task.prompt_len, tok.pad_id


def _synthetic_batch():
    """Another prompt length and pad id: V 7, pad 6, prompt_len 3, answers of 1..4 tokens."""
    g = torch.Generator().manual_seed(191)
    lengths = [3 + 1, 3 + 4, 3 + 2, 3 + 3]
    T = max(lengths)
    ids = torch.randint(0, 6, (len(lengths), T), generator=g)
    for i, n in enumerate(lengths):
        ids[i, n:] = 6
    logits = torch.randn(len(lengths), T, 7, generator=g) * 2
    return ids, logits, 3, 6


def _oracle_sft(ids, logits, prompt_len, pad_id):
    """(loss, d loss / d logits) from a float64 loop over the answer tokens."""
    x = logits.double().clone().requires_grad_(True)
    terms = []
    for i in range(ids.shape[0]):
        for p in range(prompt_len, ids.shape[1]):
            tok = int(ids[i, p])
            if tok != pad_id:
                terms.append(-torch.log_softmax(x[i, p - 1], dim=-1)[tok])
    loss = torch.stack(terms).sum() / len(terms)
    loss.backward()
    return loss.detach().float(), x.grad.float()


def _sft_probe(ids, logits, prompt_len, pad_id):
    def probe(impl):
        x = logits.clone().requires_grad_(True)
        loss = impl.sft_loss(x, ids.clone(), prompt_len, pad_id)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
            return {"loss": loss, "grad": None}
        loss.reshape(()).backward()
        return {"loss": loss.detach().reshape(()).float(), "grad": x.grad}
    return probe


@check(f"{U}.sft_loss", ["sft_loss"], _ref_sft)
def check_sft_loss(t):
    for name, (ids, logits, P, pad) in (("the addition batch (answers of 1, 2 and 3 digits)", _task_batch()),
                                        ("a synthetic batch (prompt_len 3, pad_id 6)", _synthetic_batch())):
        want_loss, want_grad = _oracle_sft(ids, logits, P, pad)
        probe = _sft_probe(ids, logits, P, pad)
        got = t.run(probe)
        t.expect(isinstance(got["loss"], torch.Tensor) and got["grad"] is not None,
                 f"sft_loss on {name} must return a scalar tensor that carries the gradient of the logits; got "
                 f"{_shape(got['loss'])}")
        t.compare(probe, want_loss, f"the loss on {name}", atol=1e-4, rtol=1e-4, pick=lambda o: o["loss"])
        t.compare(probe, want_grad, f"the gradient of the loss with respect to the logits on {name} (zero at every "
                  "position that does not predict an answer token)", atol=1e-5, rtol=1e-4, pick=lambda o: o["grad"])
    ids, logits, P, pad = _task_batch()
    err = t.raised(lambda impl: impl.sft_loss(logits[:, :-1].clone(), ids.clone(), P, pad))
    t.expect(err == "ValueError", f"sft_loss with logits (B, T-1, V) for ids (B, T) must raise ValueError; got {err}")


# ================================================================== 19.group_relative_advantages

ADV_GROUPS_4 = [[1.1, 0.1, 0.1, 0.1], [0.0, 1.1, 0.0, 0.1], [0.1, 0.1, 0.1, 0.1], [1.1, 1.1, 1.1, 1.1],
                [0.0, 0.0, 0.0, 0.0], [2.0, -1.0, 0.5, 0.25]]
ADV_GROUPS_3 = [[1.0, 0.0, 0.0], [3.0, 3.0, 3.0], [0.2, 0.7, 1.9]]
ADV_GROUPS_2 = [[1.0, 0.0], [0.5, 0.5], [0.1, 1.1]]     # the smallest valid group
# groups of 8 (the course's group size), one per call: torch reduces a single row of eight 0.1 (or 0.3, 0.7) to a
# mean that is not exactly 0.1 in float32, and to a std of ~1e-8 instead of 0
ADV_GROUPS_8 = [[0.1] * 8, [1.1] + [0.1] * 7, [0.7] * 8, [0.0] * 7 + [0.1], [0.3] * 8]


def _oracle_adv(groups) -> torch.Tensor:
    out = []
    for grp in groups:
        m = statistics.mean(grp)
        s = statistics.stdev(grp)
        out.extend([0.0 if s < 1e-12 else (r - m) / s for r in grp])
    return torch.tensor(out, dtype=torch.float32)


@check(f"{U}.group_relative_advantages", ["group_relative_advantages"], _ref_adv)
def check_group_relative_advantages(t):
    evidence = torch.tensor([1.1, 0.1, 0.1, 0.1])
    t.compare(lambda impl: impl.group_relative_advantages(evidence.clone(), 4), torch.tensor([1.5, -0.5, -0.5, -0.5]),
              "the stated evidence: one group [1.1, 0.1, 0.1, 0.1]", atol=2e-3, rtol=1e-3)
    for groups, G in ((ADV_GROUPS_4, 4), (ADV_GROUPS_3, 3), (ADV_GROUPS_2, 2), (ADV_GROUPS_8, 8)):
        r = torch.tensor([x for grp in groups for x in grp])
        if G == 8:  # one prompt per call (B = 1): torch's reduction over a single row shows the rounding
            probe = functools.partial(lambda impl, r, G: torch.cat([impl.group_relative_advantages(x.clone(), G)
                                                                    for x in r.split(G)]), r=r, G=G)
        else:
            probe = functools.partial(lambda impl, r, G: impl.group_relative_advantages(r.clone(), G), r=r, G=G)
        got = t.run(probe)
        t.expect(isinstance(got, torch.Tensor) and tuple(got.shape) == (len(r),),
                 f"{len(groups)} groups of {G}: return one advantage per completion, shape ({len(r)},); got {_shape(got)}")
        t.expect(bool(torch.isfinite(got).all()), f"{len(groups)} groups of {G}, some of them without spread: the "
                 "advantages contain NaN or inf", bug="B19.zero_std_nan")
        t.compare(probe, _oracle_adv(groups), f"{len(groups)} groups of {G} (with spread, without spread, all zero)"
                  + (", one group per call: equal rewards whose float32 mean is not exactly their value" if G == 8
                     else ""),
                  atol=2e-3, rtol=1e-3)
    for what, call in (("2-D rewards (B, G)", lambda impl: impl.group_relative_advantages(torch.rand(3, 4), 4)),
                       ("group_size 1", lambda impl: impl.group_relative_advantages(torch.rand(4), 1)),
                       ("10 rewards in groups of 4", lambda impl: impl.group_relative_advantages(torch.rand(10), 4))):
        err = t.raised(call)
        t.expect(err == "ValueError", f"group_relative_advantages with {what} must raise ValueError; got {err}")


# ================================================================== 19.per_token_logps


@functools.lru_cache(maxsize=1)
def _logps_model_state():
    from llmcourse.models.llama3 import Llama3Config
    from llmcourse.models.llama3_cached import CachedLlama3Model

    cfg = dict(vocab_size=16, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=64,
               context_length=16, rope_theta=10000.0)
    torch.manual_seed(192)
    model = CachedLlama3Model(Llama3Config(**cfg)).eval()
    with torch.no_grad():      # larger weights than the init: log-probabilities far from uniform
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(3.0)
    seqs = torch.randint(0, 16, (4, 13), generator=torch.Generator().manual_seed(193))
    return cfg, {k: v.clone() for k, v in model.state_dict().items()}, seqs


def _build(cfg, state):
    from llmcourse.models.llama3 import Llama3Config
    from llmcourse.models.llama3_cached import CachedLlama3Model

    m = CachedLlama3Model(Llama3Config(**cfg)).eval()
    m.load_state_dict(state)
    return m


def _oracle_logps(cfg, state, seqs, prompt_len) -> torch.Tensor:
    model = _build(cfg, state)
    cols = []
    with torch.no_grad():
        for p in range(prompt_len, seqs.shape[1]):
            last = torch.log_softmax(model(seqs[:, :p])[:, -1].double(), dim=-1)
            cols.append(last.gather(1, seqs[:, p:p + 1])[:, 0])
    return torch.stack(cols, dim=1).float()


def _peaked_state(state: dict, scale: float = 60.0) -> dict:
    """The same model with its output layer scaled: log-probabilities down to about −10³, below float32's
    smallest positive probability (exp(−103) is 0 after a softmax in float32; the log-softmax stays finite)."""
    out = {k: v.clone() for k, v in state.items()}
    out["lm_head.weight"] = out["lm_head.weight"] * scale
    return out


@check(f"{U}.per_token_logps", ["per_token_logps"], _ref_logps)
def check_per_token_logps(t):
    cfg, state, seqs = _logps_model_state()
    for P in (10, 3, 1):       # 1: the smallest valid prompt (one token)
        def probe(impl, P=P):
            m = _build(cfg, state)
            calls = []
            m.register_forward_pre_hook(lambda mod, args: calls.append(1))
            out = impl.per_token_logps(m, seqs.clone(), P)
            grads = False
            if isinstance(out, torch.Tensor) and out.requires_grad:
                out.sum().backward()
                grads = any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in m.parameters())
            return {"out": out.detach() if isinstance(out, torch.Tensor) else out, "grads": grads,
                    "calls": len(calls)}
        got = t.run(probe)
        want_shape = (seqs.shape[0], seqs.shape[1] - P)
        out = got["out"]
        every_position = isinstance(out, torch.Tensor) and tuple(out.shape) == (seqs.shape[0], seqs.shape[1] - 1)
        t.expect(isinstance(out, torch.Tensor) and tuple(out.shape) == want_shape,
                 f"sequences {tuple(seqs.shape)} with prompt_len {P}: the result must be (N, T − prompt_len) = "
                 f"{want_shape}; got {_shape(out)}", bug="B19.logps_include_prompt" if every_position else None)
        t.compare(probe, _oracle_logps(cfg, state, seqs, P), f"log-probabilities of the completion tokens "
                  f"(prompt_len {P}) against a forward pass that reads only the tokens before each one", atol=1e-4,
                  rtol=1e-4, pick=lambda o: o["out"])
        t.expect(got["grads"], "no gradient reached the model's parameters: compute the log-probabilities with "
                 "gradients on (the policy is trained through them)")
        t.expect(got["calls"] == 1, f"per_token_logps called the model {got['calls']} times for one batch of "
                 f"{seqs.shape[1] - P} completion positions: the contract asks for one forward pass",
                 bug="B19.forward_per_position" if got["calls"] > 1 else None)
    peaked = _peaked_state(state)
    P = 3
    t.compare(lambda impl: impl.per_token_logps(_build(cfg, peaked), seqs.clone(), P).detach(),
              _oracle_logps(cfg, peaked, seqs, P), "log-probabilities of a very confident model (some tokens have "
              "a probability below float32's smallest positive number; their log-probability is still finite)",
              atol=2e-3, rtol=1e-4)
    for P in (0, seqs.shape[1]):
        err = t.raised(lambda impl, P=P: impl.per_token_logps(_build(cfg, state), seqs.clone(), P))
        t.expect(err == "ValueError", f"per_token_logps with prompt_len {P} and T = {seqs.shape[1]} must raise "
                 f"ValueError; got {err}")


# ================================================================== 19.grpo_loss


def _loss_inputs():
    g = torch.Generator().manual_seed(194)
    N, T = 6, 5
    logps = -torch.rand(N, T, generator=g) * 3 - 0.05
    old = logps + torch.randn(N, T, generator=g) * 0.4       # ratios from ~0.3 to ~3: the clip acts both ways
    ref = logps + torch.randn(N, T, generator=g) * 0.5
    adv = torch.tensor([1.2, -0.8, 0.5, -1.5, 0.0, 0.9])
    lengths = torch.tensor([5, 3, 1, 4, 2, 0])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return logps, old, ref, adv, mask


def _oracle_loss(logps, old, ref, adv, mask, clip_eps=0.2, beta=0.04):
    x = logps.double().clone().requires_grad_(True)
    rows = []
    for i in range(x.shape[0]):
        terms = []
        for t in range(x.shape[1]):
            if not bool(mask[i, t]):
                continue
            rho = torch.exp(x[i, t] - float(old[i, t]))
            a = float(adv[i])
            clipped = torch.clamp(rho, 1 - clip_eps, 1 + clip_eps)
            surrogate = torch.minimum(rho * a, clipped * a)
            r = torch.exp(float(ref[i, t]) - x[i, t])                  # π_ref / π_θ
            k3 = r - torch.log(r) - 1
            terms.append(surrogate - beta * k3)
        rows.append(torch.stack(terms).mean() if terms else x.sum() * 0.0)
    loss = -torch.stack(rows).mean()
    loss.backward()
    return loss.detach().float(), x.grad.float()


def _loss_probe(logps, old, ref, adv, mask, **kw):
    def probe(impl):
        x, o, r = (v.clone().requires_grad_(True) for v in (logps, old, ref))
        loss = impl.grpo_loss(x, o, r, adv.clone(), mask.clone(), **kw)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
            return {"loss": loss, "grad": None, "old_grad": None, "ref_grad": None}
        loss.reshape(()).backward()
        return {"loss": loss.detach().reshape(()).float(), "grad": x.grad, "old_grad": o.grad, "ref_grad": r.grad}
    return probe


def _reached(g) -> bool:
    return isinstance(g, torch.Tensor) and bool(g.abs().sum() > 0)


@check(f"{U}.grpo_loss", ["grpo_loss"], _ref_loss)
def check_grpo_loss(t):
    inputs = _loss_inputs()
    for kw, what in (({}, "the defaults (clip_eps 0.2, beta 0.04)"), ({"clip_eps": 0.1, "beta": 0.3},
                                                                       "clip_eps 0.1, beta 0.3")):
        probe = _loss_probe(*inputs, **kw)
        got = t.run(probe)
        t.expect(isinstance(got["loss"], torch.Tensor) and got["grad"] is not None,
                 f"grpo_loss must return a scalar tensor that carries the gradient of logps; got {_shape(got['loss'])}")
        want_loss, want_grad = _oracle_loss(*inputs, **kw)
        t.compare(probe, want_loss, f"the loss of 6 completions (ratios inside and outside the clip range, one "
                  f"empty row) with {what}", atol=1e-5, rtol=1e-4, pick=lambda o: o["loss"])
        t.compare(probe, want_grad, f"the gradient of the loss with respect to logps with {what}", atol=1e-5,
                  rtol=1e-4, pick=lambda o: o["grad"])
        t.expect(not _reached(got["ref_grad"]), "a gradient reached ref_logps: the reference model would be trained "
                 "along with the policy", bug="B19.ref_not_frozen")
        t.expect(not _reached(got["old_grad"]), "a gradient reached old_logps: the policy that sampled the "
                 "completions is a constant of the objective")
    logps, old, ref, adv, mask = inputs
    for what, call in (("old_logps of another shape", lambda impl: impl.grpo_loss(logps, old[:, :-1], ref, adv, mask)),
                       ("advantages (N, 1)", lambda impl: impl.grpo_loss(logps, old, ref, adv[:, None], mask))):
        err = t.raised(call)
        t.expect(err == "ValueError", f"grpo_loss with {what} must raise ValueError; got {err}")


# ================================================================== 19.grpo_update


def _ref_update():
    from llmcourse.post.grpo import grpo_update

    return {"grpo_update": grpo_update}


UPDATE_LR = 0.05


@functools.lru_cache(maxsize=1)
def _update_inputs():
    """A random tiny Llama as the policy, a perturbed copy as the reference, 8 fixed samples (2 groups of 4)."""
    cfg, state, _ = _logps_model_state()
    g = torch.Generator().manual_seed(195)
    ref_state = {k: v + 0.05 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v.clone()
                 for k, v in state.items()}
    seqs = torch.randint(0, 16, (8, 12), generator=g)
    prompt_len = 8
    rewards = torch.tensor([1.1, 0.1, 0.1, 0.0, 0.1, 0.1, 1.1, 1.1])
    lengths = torch.tensor([4, 2, 3, 1, 4, 4, 2, 3])
    mask = torch.arange(4)[None, :] < lengths[:, None]
    return cfg, state, ref_state, seqs, prompt_len, rewards, mask


def _oracle_update(cfg, state, ref_state, seqs, P, rewards, mask, G, clip_eps, beta, inner_steps, lr):
    """(losses, parameters after) from float64: statistics per group, a prefix-by-prefix forward with autograd, the
    loss as a loop over eq. 3 with k3 written from its definition, plain SGD written out (p ← p − lr·grad)."""
    policy = _build(cfg, state).double()
    ref = _build(cfg, ref_state).double()
    groups = [rewards[i:i + G].tolist() for i in range(0, len(rewards), G)]
    adv = []
    for grp in groups:
        m, sd = statistics.mean(grp), statistics.stdev(grp)
        adv.extend(0.0 if max(grp) == min(grp) else (r - m) / sd for r in grp)

    def logps(model):
        return torch.stack([torch.log_softmax(model(seqs[:, :p])[:, -1], dim=-1).gather(1, seqs[:, p:p + 1])[:, 0]
                            for p in range(P, seqs.shape[1])], dim=1)

    with torch.no_grad():
        old, ref_lp = logps(policy), logps(ref)
    losses = []
    for _ in range(inner_steps):
        lp = logps(policy)
        rows = []
        for i in range(lp.shape[0]):
            terms = []
            for t in range(lp.shape[1]):
                if bool(mask[i, t]):
                    rho = torch.exp(lp[i, t] - old[i, t])
                    surrogate = torch.minimum(rho * adv[i], torch.clamp(rho, 1 - clip_eps, 1 + clip_eps) * adv[i])
                    r = torch.exp(ref_lp[i, t] - lp[i, t])
                    terms.append(surrogate - beta * (r - torch.log(r) - 1))
            rows.append(torch.stack(terms).mean() if terms else lp.sum() * 0.0)
        loss = -torch.stack(rows).mean()
        params = [p for p in policy.parameters()]
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        with torch.no_grad():
            for p, gr in zip(params, grads):
                if gr is not None:
                    p -= lr * gr
        losses.append(float(loss.detach()))
    return losses, {k: v.float() for k, v in policy.state_dict().items()}


def _update_probe(cfg, state, ref_state, seqs, P, rewards, mask, G, inner_steps, lr, **kw):
    def probe(impl):
        from llmcourse.post import grpo as course

        fn = getattr(impl.grpo_update, "__wrapped__", None)
        if fn is not None:  # one mistake costs one exercise: the learner's update runs on the course's own pieces
            fn.__globals__.update(group_relative_advantages=course.group_relative_advantages,
                                  per_token_logps=course.per_token_logps, grpo_loss=course.grpo_loss)
        policy, ref = _build(cfg, state), _build(cfg, ref_state)
        ref_before = {k: v.detach().clone() for k, v in ref.state_dict().items()}
        opt = torch.optim.SGD(policy.parameters(), lr=lr)
        losses = impl.grpo_update(policy, ref, opt, seqs.clone(), P, rewards.clone(), mask.clone(), G,
                                  inner_steps=inner_steps, **kw)
        ref_after = {k: v.detach().clone() for k, v in ref.state_dict().items()}
        return {"losses": [float(x) for x in losses] if isinstance(losses, (list, tuple)) else losses,
                "params": {k: v.detach().clone() for k, v in policy.state_dict().items()},
                "ref_changed": any(not torch.equal(ref_after[k], ref_before[k]) for k in ref_before),
                "ref_grads": any(p.grad is not None for p in ref.parameters())}
    return probe


@check(f"{U}.grpo_update", ["grpo_update"], _ref_update)
def check_grpo_update(t):
    cfg, state, ref_state, seqs, P, rewards, mask = _update_inputs()
    for inner, kw in ((1, {}), (2, {}), (3, {"clip_eps": 0.1, "beta": 0.3})):
        probe = _update_probe(cfg, state, ref_state, seqs, P, rewards, mask, 4, inner, UPDATE_LR, **kw)
        got = t.run(probe)
        want_losses, want_params = _oracle_update(cfg, state, ref_state, seqs, P, rewards, mask, 4,
                                                  kw.get("clip_eps", 0.2), kw.get("beta", 0.04), inner, UPDATE_LR)
        what = f"inner_steps={inner}" + (", clip_eps 0.1, beta 0.3" if kw else "")
        t.expect(isinstance(got["losses"], list) and len(got["losses"]) == inner,
                 f"grpo_update with {what} must return a list of {inner} losses (one per step); got "
                 f"{got['losses'] if not isinstance(got['losses'], list) else len(got['losses'])}")
        t.compare(probe, torch.tensor(want_losses), f"the losses of each step with {what} (2 groups of 4 fixed samples, "
                  "SGD)", atol=1e-5, rtol=1e-4, pick=lambda o: torch.tensor(o["losses"]))
        names = sorted(want_params)
        t.compare(probe, [want_params[k] for k in names], f"the policy's parameters after the update with {what} "
                  f"(plain SGD at lr {UPDATE_LR}, against a float64 route)", atol=1e-5, rtol=1e-4,
                  pick=lambda o, names=names: [o["params"][k] for k in names])
        t.expect(not got["ref_changed"] and not got["ref_grads"], "the reference model received gradients or "
                 "changed: it is frozen, only the policy is trained")
    err = t.raised(lambda impl: impl.grpo_update(_build(cfg, state), _build(cfg, ref_state),
                                                 torch.optim.SGD(_build(cfg, state).parameters(), lr=0.1),
                                                 seqs.clone(), P, rewards.clone(), mask.clone(), 4, inner_steps=0))
    t.expect(err == "ValueError", f"grpo_update with inner_steps=0 must raise ValueError; got {err}")


# ================================================================== declared strength (grader/strength.py)

defining_property(
    f"{U}.addition_reward",
    "a rule-based reward pays correctness only to a well-formed answer: read up to the first <eos>, a number "
    "without leading zeros, cut-off completions earn nothing; the two weights scale the two terms",
    probe="the learner's reward on four groups of completions (well-formed, cut off, malformed, text after <eos>), "
          "each against an oracle from str.isdigit and an int/str round trip, at the default and at other weights; "
          "a malformed completion that holds the sum and is paid as correct is named")
defining_property(
    f"{U}.sft_loss",
    "fine-tuning learns the completion only: next-token cross-entropy on the answer tokens and their <eos>, "
    "the prompt and the padding masked, one mean over the batch's tokens",
    probe="the loss and its gradient with respect to the logits (zero at every position that does not predict an "
          "answer token), against a float64 loop over (row, position) pairs, on two batches with different "
          "prompt_len, pad_id and answer lengths")
defining_property(
    f"{U}.group_relative_advantages",
    "the baseline of each completion is its own prompt's group: rewards centred on the group mean and divided by "
    "the group's sample std, a group without spread giving exactly 0",
    probe="the advantages of groups of 4, 3 and 2 (with spread, constant, all zero) and of groups of 8 passed one "
          "per call (equal rewards whose float32 mean is not exactly their value) against statistics.mean/stdev per "
          "group; NaN/inf counted; ValueError on bad input")
defining_property(
    f"{U}.per_token_logps",
    "one causal forward scores every completion token from the tokens before it: the logit at p − 1 scores the "
    "token at p, as log-softmax, with gradients to the model",
    probe="the learner's log-probabilities against a prefix-by-prefix forward of a random Llama at three prompt "
          "lengths (1 included) and with a peaked output layer (log-probabilities below float32's smallest probability); the "
          "model's forward calls are counted by a hook; gradients to the parameters observed")
defining_property(
    f"{U}.grpo_loss",
    "the GRPO loss is the pessimistic clipped surrogate on per-token ratios π_θ/π_old minus β·k3(π_θ‖π_ref), "
    "each completion averaged over its own tokens, then over completions; no gradient to the old or reference "
    "policy",
    probe="the loss and its gradient with respect to logps against a float64 loop over DeepSeekMath eq. 3 with "
          "ratios on both sides of the clip range, both advantage signs, rows of different lengths and an empty "
          "row, at the defaults and at clip_eps 0.1, beta 0.3; gradients reaching old_logps and ref_logps observed")

decision(f"{U}.addition_reward", "how 'a number without leading zeros' is recognised",
         forms=[r"\[1-9\]\s*(\[0-9\]|\\d)\*", r"str\(\s*int\(\s*\w+\s*\)\s*\)\s*==\s*\w+",
                r"lstrip\(\s*['\"]0['\"]\s*\)", r"startswith\(\s*['\"]0['\"]\s*\)",
                r"len\(\s*\w+\s*\)\s*>\s*1\s*and\s*\w+\[\s*0\s*\]\s*==\s*['\"]0['\"]"],
         wrong=("B19.leading_zeros",))
decision(f"{U}.addition_reward", "where the answer ends: at the first <eos> only",
         forms=[r"(split|partition)\(\s*['\"]<eos>['\"]\s*,\s*1\s*\)\[0\]", r"\.index\(\s*['\"]<eos>['\"]\s*\)\s*\]"],
         wrong=("B19.reads_past_eos",))
decision(f"{U}.sft_loss", "which logits score which tokens: the logits at prompt_len − 1 … T − 2 score the tokens at "
         "prompt_len … T − 1",
         forms=[r"\[\s*:\s*,\s*\w*prompt_len\s*-\s*1\s*:\s*-\s*1\s*\]", r"logits\[\s*:\s*,\s*:\s*-\s*1\s*\]"],
         wrong=("B19.no_shift", "B19.first_answer_token_missed"))
decision(f"{U}.sft_loss", "which targets are masked: the padding by its id, the <eos> after the answer kept",
         forms=[r"\w+\s*!=\s*pad_id\b", r"ignore_index\s*=\s*pad_id"],
         wrong=("B19.pad_in_loss", "B19.eos_not_learned"))
decision(f"{U}.group_relative_advantages", "how a group without spread is kept from dividing by zero",
         forms=[r"torch\.where\(\s*\w+\s*(>|==)\s*0", r"nan_to_num\(", r"\.clamp(_min)?\(\s*(min\s*=\s*)?1e-",
                r"masked_fill\(\s*\w+\s*,\s*0", r"amax\(.{0,60}==.{0,40}amin\(", r"max\(.{0,60}==.{0,40}min\("],
         wrong=("B19.zero_std_nan", "B19.spread_by_rounding"))
decision(f"{U}.per_token_logps", "which logits score the completion's tokens (the shift by one)",
         forms=[r"\[\s*:\s*,\s*\w*prompt_len\s*-\s*1\s*:\s*(-\s*1|\w+\s*-\s*1)\s*\]"],
         wrong=("B19.logps_unshifted", "B19.logps_include_prompt"))
decision(f"{U}.grpo_loss", "where the gradient is cut: old and reference log-probabilities detached",
         forms=[r"old_logps\.detach\(\)", r"ref_logps\.detach\(\)"],
         wrong=("B19.ref_not_frozen",))


defining_property(
    f"{U}.grpo_update",
    "one GRPO update on fixed samples: advantages and the old and reference log-probabilities computed once, "
    "before any step, then inner_steps optimizer steps each from clean gradients, so that from the second step "
    "on the ratio π_θ/π_old departs from 1 and the clip acts; the reference stays frozen",
    probe="the losses returned and the policy's parameters after 1, 2 and 3 SGD steps (the last at clip_eps 0.1, "
          "beta 0.3) against a float64 route (statistics per group, a prefix-by-prefix forward with autograd, eq. 3 "
          "written as a loop, p ← p − lr·grad written out); the reference's parameters and gradients observed; the "
          "learner's update runs on the course's own advantages, log-probabilities and loss")


# Library objects that compute a graded answer without going through its reference: blocked in the worker like the
# reference (grader.runner.also_blocked; tests/test_blocked_siblings.py).
also_blocked(f"{U}.addition_reward", "llmcourse.post.task:parse_completion")
also_blocked(f"{U}.sft_loss", "llmcourse.post.sft:sft_labels")
also_blocked(f"{U}.grpo_loss", "llmcourse.post.grpo:kl_k3")

