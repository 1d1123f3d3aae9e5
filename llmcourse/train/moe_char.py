"""A tiny DeepSeekMoE character model and the expert-load runs of unit 14 (``assets/moe_load_runs.pt``).

The model is ``llama3-tiny``'s attention stack (D 128, 4 heads, 2 KV heads, 3 layers, context 64) whose
feed-forward blocks are :class:`~llmcourse.models.deepseek_moe.DeepSeekMoE` layers with the sizes of the
unit's parameter count (I = 128, E = 8 routed experts, S = 1 shared, top-2, one group). The dense model of
**equal active parameters** is the same stack with SwiGLU width ``3·128 = 384`` (two routed experts and the
shared one are active per token; the router's 1,024 weights per layer are the only difference).

Every run trains on tinyshakespeare's characters with unit 10's :func:`~llmcourse.train.pretraining.pretrain`
(identical batches for every run, AdamW, warmup + cosine). After each optimizer step a callback records the
number of ``(token, slot)`` assignments of every expert in every layer and, for the bias runs, applies the
sign update (the bias is a float32 buffer, outside the optimizer). Five reference runs::

    none      no balancing at all
    aux       the auxiliary loss α·Σ f_i·P_i (α = 0.01, P from the normalised sigmoid scores), no bias update
    g1e-4 / g1e-3 / g1e-2   the bias update with γ = 1e-4, 1e-3, 1e-2

Re-create the asset with::

    python -m llmcourse.train.moe_char          # five runs of 300 steps, about 5-15 minutes on 2 CPU cores

The file holds plain data only (``torch.load(..., weights_only=True)``)::

    {"recipe": dict, "moe": DeepSeekMoE keyword arguments, "runs": {name: {"gamma", "aux_alpha",
     "loads" (steps, layers, E) int16, "loss" (steps,) float32, "eval_step", "val_loss", "ms_per_step",
     "final_bias" (layers, E) float32, "router_logits" (layers, T, E) float32 for the probe sentence}},
     "probe_text": str, "dense_ms_per_step": float}
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
from torch import Tensor, nn

from ..models.deepseek_moe import DeepSeekMoE, load_balancing_loss
from ..models.llama3 import Llama3Config, Llama3Model

__all__ = ["MOE_CHAR_RECIPE", "MOE_KW", "RUNS", "MoECharModel", "moe_char_config", "dense_char_model",
           "train_moe_char", "max_mean_ratio", "moe_load_runs_path", "load_moe_load_runs", "record_runs",
           "PROBE_TEXT"]

MOE_KW = dict(moe_intermediate_size=128, n_routed_experts=8, n_shared_experts=1, top_k=2, n_group=1, topk_group=1,
              routed_scaling_factor=1.0, norm_topk_prob=True)
MOE_CHAR_RECIPE = dict(context_length=64, batch_size=32, steps=300, max_lr=3e-3, min_lr=3e-4, warmup_steps=30,
                       weight_decay=0.1, max_norm=1.0, seed=0, eval_every=100, eval_batches=5)
RUNS = {"none": dict(gamma=0.0, aux_alpha=0.0), "aux": dict(gamma=0.0, aux_alpha=0.01),
        "g1e-4": dict(gamma=1e-4, aux_alpha=0.0), "g1e-3": dict(gamma=1e-3, aux_alpha=0.0),
        "g1e-2": dict(gamma=1e-2, aux_alpha=0.0)}
PROBE_TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?"


def moe_char_config(vocab_size: int = 65, context_length: int = 64, intermediate_size: int = 384) -> Llama3Config:
    """The attention stack shared by the MoE model and its dense twin (``llama3-tiny`` with 3 layers)."""
    return Llama3Config(vocab_size=vocab_size, d_model=128, n_layers=3, n_heads=4, n_kv_heads=2,
                        intermediate_size=intermediate_size, context_length=context_length, rope_theta=10000.0)


class _AttachAux(torch.autograd.Function):
    """Identity on ``x`` whose backward also sends gradient 1 to the scalar ``aux`` (adds ``aux`` to any loss of x)."""

    @staticmethod
    def forward(ctx, x, aux):
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, torch.ones((), dtype=grad.dtype, device=grad.device)


class MoECharModel(Llama3Model):
    """:class:`Llama3Model` whose ``layers.{i}.mlp`` are :class:`DeepSeekMoE` layers (keys as Llama's plus the MoE's).

    ``forward(idx)`` ``(B, T)`` -> logits ``(B, T, V)``. With ``aux_alpha > 0`` in training mode, the auxiliary
    loss of every layer (:func:`load_balancing_loss` on the sigmoid scores normalised per token) is attached to
    the logits' backward, so ``loss(logits).backward()`` minimises ``loss + aux`` without changing the training
    loop; ``last_aux`` holds its value. :meth:`update_biases` applies each layer's sign update.
    """

    def __init__(self, cfg: Llama3Config, moe_kw: dict | None = None, aux_alpha: float = 0.0, gamma: float = 0.0):
        super().__init__(cfg)
        self.moe_kw = dict(MOE_KW if moe_kw is None else moe_kw)
        for layer in self.layers:
            layer.mlp = DeepSeekMoE(cfg.d_model, bias_update_speed=gamma, **self.moe_kw)
        self.aux_alpha = aux_alpha
        self.last_aux = 0.0
        self.init_weights()

    def moe_layers(self) -> list[DeepSeekMoE]:
        return [layer.mlp for layer in self.layers]

    def forward(self, idx: Tensor) -> Tensor:
        logits = super().forward(idx)
        if self.training and self.aux_alpha > 0:
            aux = 0.0
            for m in self.moe_layers():
                s = torch.sigmoid(m.last_router_logits)
                aux = aux + load_balancing_loss(s / s.sum(-1, keepdim=True), m.last_indices, m.n_routed_experts,
                                                self.aux_alpha)
            self.last_aux = float(aux.detach())
            logits = _AttachAux.apply(logits, aux)
        return logits

    @torch.no_grad()
    def update_biases(self) -> None:
        for m in self.moe_layers():
            m.update_bias()

    def loads(self) -> Tensor:
        """``(layers, E)`` long: assignments per expert in the last training-mode forward."""
        return torch.stack([torch.bincount(m.last_indices.flatten(), minlength=m.n_routed_experts)
                            for m in self.moe_layers()])


def dense_char_model(vocab_size: int = 65, context_length: int = 64) -> Llama3Model:
    """The dense twin with equal active parameters: SwiGLU width 3·128 = 384 in every layer."""
    return Llama3Model(moe_char_config(vocab_size, context_length, intermediate_size=3 * MOE_KW["moe_intermediate_size"]))


def max_mean_ratio(loads: Tensor) -> Tensor:
    """Max over experts / mean over experts of ``loads`` ``(..., E)``: 1 = perfectly balanced.

    With top-``k`` routing over ``E`` experts (``k`` distinct experts per token) the ratio is at most ``E/k``:
    an expert receives at most one assignment per token (max ≤ N) while the mean is ``k·N/E``. ``E/k`` is reached
    when every token is sent to the same ``k`` experts (4 for the unit's 8 experts, top-2), not ``E``.
    """
    loads = loads.float()
    return loads.max(-1).values / loads.mean(-1)


def train_moe_char(recipe: dict | None = None, gamma: float = 0.0, aux_alpha: float = 0.0, dense: bool = False,
                   progress: bool = True, corpus=None) -> tuple[nn.Module, dict]:
    """Train the MoE character model (or, with ``dense``, its dense twin) with :func:`pretrain`.

    ``recipe``: keys of :data:`MOE_CHAR_RECIPE` (missing ones from it). Seeds ``torch.manual_seed(seed)``
    before building, so every run starts from the same weights and sees the same batches. Returns
    ``(model in eval mode, history)``: pretrain's history plus ``loads`` ``(steps, layers, E)`` long (empty for
    dense), ``aux`` (per-step auxiliary loss) and ``gamma``/``aux_alpha``.
    """
    from ..data.corpus import char_corpus
    from .pretraining import pretrain

    r = {**MOE_CHAR_RECIPE, **(recipe or {})}
    corpus = corpus or char_corpus("tinyshakespeare")
    torch.manual_seed(r["seed"])
    if dense:
        model = dense_char_model(corpus.vocab_size, r["context_length"])
    else:
        model = MoECharModel(moe_char_config(corpus.vocab_size, r["context_length"]), aux_alpha=aux_alpha, gamma=gamma)
    loads: list[Tensor] = []
    aux: list[float] = []

    def after_step(hist: dict) -> None:
        if dense or len(hist["step"]) <= len(loads):
            return
        loads.append(model.loads())
        aux.append(model.last_aux)
        if gamma > 0:
            model.update_biases()

    hist = pretrain(model, corpus.train, corpus.val, steps=r["steps"], batch_size=r["batch_size"],
                    context_length=r["context_length"], max_lr=r["max_lr"], min_lr=r["min_lr"],
                    warmup_steps=r["warmup_steps"], weight_decay=r["weight_decay"], max_norm=r["max_norm"],
                    seed=r["seed"], eval_every=r["eval_every"], eval_batches=r["eval_batches"],
                    callback=after_step, callback_every=1, progress=progress)
    hist["loads"] = torch.stack(loads) if loads else torch.zeros(0, dtype=torch.long)
    hist["aux"], hist["gamma"], hist["aux_alpha"] = aux, gamma, aux_alpha
    return model.eval(), hist


@torch.no_grad()
def probe_router_logits(model: MoECharModel, tokenizer, text: str = PROBE_TEXT) -> Tensor:
    """Router logits ``(layers, T, E)`` float32 of every MoE layer for ``text`` (eval mode, one pass)."""
    seen = []
    hooks = [m.gate.register_forward_hook(lambda mod, inp, out: seen.append(out[0].detach().clone()))
             for m in model.moe_layers()]
    try:
        model.eval()(torch.tensor([tokenizer.encode(text)]))
    finally:
        for h in hooks:
            h.remove()
    return torch.stack(seen)


def moe_load_runs_path() -> Path:
    """``<course>/assets/moe_load_runs.pt``."""
    return Path(__file__).resolve().parents[2] / "assets" / "moe_load_runs.pt"


def record_runs(recipe: dict | None = None, runs: dict | None = None, progress: bool = True,
                dense_steps: int = 100) -> dict:
    """Train every run of ``runs`` (default :data:`RUNS`) and the dense twin (``dense_steps`` steps, timing
    only); return the asset dictionary described in the module docstring."""
    from ..data.corpus import char_corpus

    r = {**MOE_CHAR_RECIPE, **(recipe or {})}
    corpus = char_corpus("tinyshakespeare")
    out: dict = {"recipe": r, "moe": dict(MOE_KW), "runs": {}, "probe_text": PROBE_TEXT}
    for name, opts in (runs or RUNS).items():
        if progress:
            print(f"run {name}: {opts}")
        model, hist = train_moe_char(r, progress=progress, corpus=corpus, **opts)
        out["runs"][name] = {
            **opts, "loads": hist["loads"].to(torch.int16), "loss": torch.tensor(hist["loss"], dtype=torch.float32),
            "aux": torch.tensor(hist["aux"], dtype=torch.float32), "eval_step": list(hist["eval_step"]),
            "val_loss": [float(v) for v in hist["val_loss"]], "ms_per_step": float(hist["ms_per_step"]),
            "final_bias": torch.stack([m.gate.e_score_correction_bias.clone() for m in model.moe_layers()]),
            "router_logits": probe_router_logits(model, corpus.tokenizer)}
    _, dense = train_moe_char(dict(r, steps=dense_steps, eval_every=dense_steps, warmup_steps=min(r["warmup_steps"], dense_steps // 2)), dense=True, progress=progress,
                              corpus=corpus)
    out["dense_ms_per_step"] = float(dense["ms_per_step"])
    out["dense_steps"] = dense_steps
    return out


def load_moe_load_runs(path: str | Path | None = None) -> dict:
    """The recorded runs (plain data, ``weights_only=True``); ``FileNotFoundError`` naming the command when missing."""
    p = Path(path) if path is not None else moe_load_runs_path()
    if not p.exists():
        raise FileNotFoundError(f"{p} is missing; re-create it with `python -m llmcourse.train.moe_char`")
    return torch.load(p, map_location="cpu", weights_only=True)


def summary(runs: dict, last: int = 50) -> dict[str, float]:
    """Mean over the last ``last`` steps and the layers of the max/mean load ratio, per run."""
    return {name: float(max_mean_ratio(run["loads"][-last:]).mean()) for name, run in runs["runs"].items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=MOE_CHAR_RECIPE["steps"])
    parser.add_argument("--out", default=str(moe_load_runs_path()))
    parser.add_argument("--threads", type=int, default=1, help="torch threads (one is faster on a busy 2-core box)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = record_runs({"steps": args.steps})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(data, out)
    for name, ratio in summary(data).items():
        run = data["runs"][name]
        print(f"{name:6s} max/mean load (last 50 steps) {ratio:.3f}  val loss {run['val_loss'][-1]:.4f}  "
              f"{run['ms_per_step']:.0f} ms/step")
    print(f"dense twin {data['dense_ms_per_step']:.0f} ms/step; {out} is {out.stat().st_size / 1e6:.3f} MB")
    return 0 if all(math.isfinite(r["val_loss"][-1]) for r in data["runs"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
