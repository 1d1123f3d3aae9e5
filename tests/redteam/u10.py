"""Unit 10 red-team corpus (see tests/redteam/__init__.py)."""

from tests.redteam import Answer
from tests.redteam.edits import edited

U = "10"
CE = "F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=ignore_index)"
SCALE = "        for g in grads:\n            g.mul_(max_norm / (norm + eps))\n"
DECAYED, NOT_DECAYED = "[p for p in params if p.dim() >= 2]", "[p for p in params if p.dim() < 2]"
SET_LR = '        for group in optimizer.param_groups:\n            group["lr"] = lr_fn(s)\n'

ANSWERS = [
    # ---------------------------------------------------------------- 10.get_batch
    Answer("10.get_batch", "y is x (no shift)", edited(U, "get_batch",
           ("return x.long(), y.long()", "return x.long(), x.long().clone()")), bug="B10.target_not_shifted"),
    Answer("10.get_batch", "keeps the data's dtype", edited(U, "get_batch",
           ("return x.long(), y.long()", "return x, y")), says=r"x must be long"),
    # ---------------------------------------------------------------- 10.lm_loss
    Answer("10.lm_loss", "cross_entropy on (B, T, V) directly (classes on the wrong axis)", edited(U, "lm_loss",
           (CE, 'F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=ignore_index, reduction="sum") '
                "/ targets.numel()")), says=r"target is -100.*must not count"),
    Answer("10.lm_loss", "ignore_index dropped", edited(U, "lm_loss",
           (CE, "F.cross_entropy(logits.flatten(0, 1), targets.flatten().clamp(min=0))")),
           says=r"target is -100.*must not count"),
    Answer("10.lm_loss", "perplexity as 2 ** loss", edited(U, "perplexity",
           ("math.exp(float(mean_loss))", "2.0 ** float(mean_loss)")), says=r"perplexity\(ln 65\): expected 65"),
    # ---------------------------------------------------------------- 10.warmup_cosine_lr
    Answer("10.warmup_cosine_lr", "warm-up starts at 0 (step / warmup_steps)", edited(U, "warmup_cosine_lr",
           ("max_lr * (step + 1) / warmup_steps", "max_lr * step / warmup_steps")), bug="B10.warmup_from_zero"),
    Answer("10.warmup_cosine_lr", "decay to 0 instead of min_lr", edited(U, "warmup_cosine_lr",
           ("min_lr + 0.5 * (max_lr - min_lr) * (1 +", "0.5 * max_lr * (1 +")), bug="B10.cosine_to_zero"),
    Answer("10.warmup_cosine_lr", "a lookup table of the required values, linear in between",
           edited(U, "warmup_cosine_lr", ("if step > total_steps", "if step >= total_steps"),
                  ("return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * progress))",
                   "return max_lr - (max_lr - min_lr) * progress")), bug="B10.linear_decay"),
    # ---------------------------------------------------------------- 10.clip_grad_norm
    Answer("10.clip_grad_norm", "clips each gradient by its own norm", edited(U, "clip_grad_norm",
           ("    grads = [p.grad for p in parameters if p.grad is not None]\n    if not grads:\n        return 0.0\n"
            "    norm = math.sqrt(sum(float((g.float() ** 2).sum()) for g in grads))\n    if norm > max_norm:\n"
            + SCALE + "    return norm\n",
            "    total = 0.0\n    for p in parameters:\n        if p.grad is None:\n            continue\n"
            "        n = float(p.grad.norm())\n        total += n * n\n        if n > max_norm:\n"
            "            p.grad.mul_(max_norm / (n + eps))\n    return math.sqrt(total)\n")), bug="B10.clip_per_param"),
    Answer("10.clip_grad_norm", "reads the generator twice (the second pass sees nothing)", edited(U, "clip_grad_norm",
           ("    grads = [p.grad for p in parameters if p.grad is not None]\n    if not grads:\n        return 0.0\n"
            "    norm = math.sqrt(sum(float((g.float() ** 2).sum()) for g in grads))\n",
            "    norm = math.sqrt(sum(float((p.grad ** 2).sum()) for p in parameters if p.grad is not None))\n"),
           (SCALE, "        for p in parameters:\n            if p.grad is not None:\n"
                   "                p.grad.mul_(max_norm / (norm + eps))\n")), says=r"may be a generator"),
    Answer("10.clip_grad_norm", "returns the norm after clipping", edited(U, "clip_grad_norm",
           (SCALE, SCALE + "        return math.sqrt(sum(float((g ** 2).sum()) for g in grads))\n")),
           says=r"global norm before clipping"),
    # ---------------------------------------------------------------- 10.configure_optimizer
    Answer("10.configure_optimizer", "no decay decided by name (bias / norm)", edited(U, "configure_optimizer",
           ("params = [p for p in model.parameters() if p.requires_grad]",
            "named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]"),
           (DECAYED, '[p for n, p in named if not (n.endswith("bias") or "norm" in n)]'),
           (NOT_DECAYED, '[p for n, p in named if n.endswith("bias") or "norm" in n]')),
           bug="B10.decay_by_name", origin="issue 38"),
    Answer("10.configure_optimizer", "decays everything (one group with weight decay)", edited(U, "configure_optimizer",
           (DECAYED, "params"), (NOT_DECAYED, "[]")), bug="B10.decay_everything"),
    Answer("10.configure_optimizer", "the embeddings are not decayed", edited(U, "configure_optimizer",
           ("    params = [p for p in model.parameters()",
            "    emb = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}\n"
            "    params = [p for p in model.parameters()"),
           (DECAYED, "[p for p in params if p.dim() >= 2 and id(p) not in emb]"),
           (NOT_DECAYED, "[p for p in params if p.dim() < 2 or id(p) in emb]")),
           says=r"missing \['pos_emb.weight', 'tok_emb.weight'\]"),
    # ---------------------------------------------------------------- 10.train_steps
    Answer("10.train_steps", "no zero_grad (gradients accumulate)", edited(U, "train_steps",
           ("        optimizer.zero_grad()\n", "")), bug="B10.no_zero_grad"),
    Answer("10.train_steps", "the RNG state is not saved (dropout differs after resuming)",
           edited(U, "save_checkpoint", ('"torch_rng": torch.get_rng_state()}',
                                         '"torch_rng": torch.ByteTensor(torch.get_rng_state().numel())}')) + "\n\n"
           + edited(U, "load_checkpoint", ('    torch.set_rng_state(ckpt["torch_rng"])\n', "")),
           says=r"restore the model, the optimizer and torch's RNG state"),
    Answer("10.train_steps", "the lr is set after the optimizer step", edited(U, "train_steps",
           (SET_LR, ""), ("        optimizer.step()\n", "        optimizer.step()\n" + SET_LR)), says=r"lr_fn\(s\)"),
]
