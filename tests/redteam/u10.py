"""Unit 10 red-team corpus (see tests/redteam/__init__.py)."""

from tests.redteam import Answer

_TRAIN = '''
def train_steps(model, optimizer, data, n_steps, start_step, batch_size, context_length, lr_fn, max_norm, seed):
{body}


def save_checkpoint(path, model, optimizer, step, config):
{save}


def load_checkpoint(path, model, optimizer):
{load}


@torch.no_grad()
def estimate_loss(model, data, batch_size, context_length, n_batches, seed=0):
    was_training = model.training
    model.eval()
    total = 0.0
    for i in range(n_batches):
        x, y = get_batch(data, batch_size, context_length, torch.Generator().manual_seed(seed + i))
        total += lm_loss(model(x), y).item()
    model.train(was_training)
    return total / n_batches
'''

_BODY = '''    model.train()
    losses = []
    for s in range(start_step, start_step + n_steps):
        x, y = get_batch(data, batch_size, context_length, torch.Generator().manual_seed(seed + s))
        for group in optimizer.param_groups:
            group["lr"] = lr_fn(s)
        optimizer.zero_grad()
        loss = lm_loss(model(x), y)
        loss.backward()
        clip_grad_norm(model.parameters(), max_norm)
        optimizer.step()
        losses.append(loss.item())
    return losses'''
_SAVE = '''    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "config": config,
                "torch_rng": torch.get_rng_state()}, path)'''
_LOAD = '''    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    torch.set_rng_state(ckpt["torch_rng"])
    return ckpt["step"]'''


def _train(body=_BODY, save=_SAVE, load=_LOAD) -> str:
    return _TRAIN.format(body=body, save=save, load=load)


ANSWERS = [
    # ---------------------------------------------------------------- 10.get_batch
    Answer("10.get_batch", "y is x (no shift)", '''
def get_batch(data, batch_size, context_length, generator):
    offsets = torch.randint(0, len(data) - context_length, (batch_size,), generator=generator)
    x = torch.stack([data[o:o + context_length] for o in offsets.tolist()])
    return x.long(), x.long().clone()
''', bug="B10.target_not_shifted"),
    Answer("10.get_batch", "keeps the data's dtype", '''
def get_batch(data, batch_size, context_length, generator):
    offsets = torch.randint(0, len(data) - context_length, (batch_size,), generator=generator)
    x = torch.stack([data[o:o + context_length] for o in offsets.tolist()])
    y = torch.stack([data[o + 1:o + context_length + 1] for o in offsets.tolist()])
    return x, y
''', says=r"x must be long"),
    # ---------------------------------------------------------------- 10.lm_loss
    Answer("10.lm_loss", "cross_entropy on (B, T, V) directly (classes on the wrong axis)", '''
def lm_loss(logits, targets, ignore_index=-100):
    return F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=ignore_index, reduction="sum") / targets.numel()


def perplexity(mean_loss):
    return math.exp(float(mean_loss))
''', says=r"target is -100.*must not count"),
    Answer("10.lm_loss", "ignore_index dropped", '''
def lm_loss(logits, targets, ignore_index=-100):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten().clamp(min=0))


def perplexity(mean_loss):
    return math.exp(float(mean_loss))
''', says=r"target is -100.*must not count"),
    Answer("10.lm_loss", "perplexity as 2 ** loss", '''
def lm_loss(logits, targets, ignore_index=-100):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=ignore_index)


def perplexity(mean_loss):
    return 2.0 ** float(mean_loss)
''', says=r"perplexity\(ln 65\): expected 65"),
    # ---------------------------------------------------------------- 10.warmup_cosine_lr
    Answer("10.warmup_cosine_lr", "warm-up starts at 0 (step / warmup_steps)", '''
def warmup_cosine_lr(step, max_lr, min_lr, warmup_steps, total_steps):
    if step < warmup_steps:
        return max_lr * step / warmup_steps
    if step > total_steps:
        return min_lr
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * progress))
''', bug="B10.warmup_from_zero"),
    Answer("10.warmup_cosine_lr", "decay to 0 instead of min_lr", '''
def warmup_cosine_lr(step, max_lr, min_lr, warmup_steps, total_steps):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step > total_steps:
        return min_lr
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return 0.5 * max_lr * (1 + math.cos(math.pi * progress))
''', bug="B10.cosine_to_zero"),
    Answer("10.warmup_cosine_lr", "a lookup table of the required values, linear in between", '''
def warmup_cosine_lr(step, max_lr, min_lr, warmup_steps, total_steps):
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= total_steps:
        return min_lr
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return max_lr - (max_lr - min_lr) * progress
''', bug="B10.linear_decay"),
    # ---------------------------------------------------------------- 10.clip_grad_norm
    Answer("10.clip_grad_norm", "clips each gradient by its own norm", '''
@torch.no_grad()
def clip_grad_norm(parameters, max_norm, eps=1e-6):
    total = 0.0
    for p in parameters:
        if p.grad is None:
            continue
        n = float(p.grad.norm())
        total += n * n
        if n > max_norm:
            p.grad.mul_(max_norm / (n + eps))
    return math.sqrt(total)
''', bug="B10.clip_per_param"),
    Answer("10.clip_grad_norm", "reads the generator twice (the second pass sees nothing)", '''
@torch.no_grad()
def clip_grad_norm(parameters, max_norm, eps=1e-6):
    norm = math.sqrt(sum(float((p.grad ** 2).sum()) for p in parameters if p.grad is not None))
    if norm > max_norm:
        for p in parameters:
            if p.grad is not None:
                p.grad.mul_(max_norm / (norm + eps))
    return norm
''', says=r"may be a generator"),
    Answer("10.clip_grad_norm", "returns the norm after clipping", '''
@torch.no_grad()
def clip_grad_norm(parameters, max_norm, eps=1e-6):
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = math.sqrt(sum(float((g ** 2).sum()) for g in grads))
    if norm > max_norm:
        for g in grads:
            g.mul_(max_norm / (norm + eps))
        return math.sqrt(sum(float((g ** 2).sum()) for g in grads))
    return norm
''', says=r"global norm before clipping"),
    # ---------------------------------------------------------------- 10.configure_optimizer
    Answer("10.configure_optimizer", "no decay decided by name (bias / norm)", '''
def configure_optimizer(model, lr, weight_decay=0.1, betas=(0.9, 0.95)):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if name.endswith("bias") or "norm" in name else decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=betas)
''', bug="B10.decay_by_name", origin="issue 38"),
    Answer("10.configure_optimizer", "decays everything (one group with weight decay)", '''
def configure_optimizer(model, lr, weight_decay=0.1, betas=(0.9, 0.95)):
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW([{"params": params, "weight_decay": weight_decay},
                              {"params": [], "weight_decay": 0.0}], lr=lr, betas=betas)
''', bug="B10.decay_everything"),
    Answer("10.configure_optimizer", "the embeddings are not decayed", '''
def configure_optimizer(model, lr, weight_decay=0.1, betas=(0.9, 0.95)):
    emb = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2 and id(p) not in emb], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2 or id(p) in emb], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas)
''', says=r"missing \['pos_emb.weight', 'tok_emb.weight'\]"),
    # ---------------------------------------------------------------- 10.train_steps
    Answer("10.train_steps", "no zero_grad (gradients accumulate)", _train(body=_BODY.replace(
        "        optimizer.zero_grad()\n", "")), bug="B10.no_zero_grad"),
    Answer("10.train_steps", "the RNG state is not saved (dropout differs after resuming)", _train(
        save='''    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "config": config,
                "torch_rng": torch.ByteTensor(torch.get_rng_state().numel())}, path)''',
        load='''    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    return ckpt["step"]'''), says=r"restore the model, the optimizer and torch's RNG state"),
    Answer("10.train_steps", "the lr is set after the optimizer step", _train(body=_BODY.replace(
        '''        for group in optimizer.param_groups:
            group["lr"] = lr_fn(s)
''', "").replace("        optimizer.step()\n", '''        optimizer.step()
        for group in optimizer.param_groups:
            group["lr"] = lr_fn(s)
''')), says=r"lr_fn\(s\)"),
]
