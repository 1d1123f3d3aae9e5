"""Red-team answers for unit 17 (the DeepSeek capstone): written from the released exercise notebook."""

from tests.redteam import Answer

_LM = '''
class DeepSeekLM(DeepSeekLM):
    def forward(self, idx, targets=None, cache=None):
        t = idx.shape[1]
        past = 0 if cache is None else cache.seq_len
        h = self.embed_tokens(idx)
        cos, sin = self.rope_cos[past:past + t], self.rope_sin[past:past + t]
        mask = self.causal[past:past + t, :past + t]
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, mask, cache, i)
        logits = self.lm_head(self.norm(h))
        out = {"logits": logits}
        if targets is None:
            return out
        v = logits.shape[-1]
        loss_main = F.cross_entropy(logits.reshape(-1, v), targets.reshape(-1))
        prev, mtp_logits, loss_mtp = h, [], []
        for k, module in enumerate(self.mtp, start=1):
            n = t - k
            emb = self.embed_tokens(idx[:, k:])
            rc, rs = self.rope_cos[k:k + n], self.rope_sin[k:k + n]  # @ROPE
            prev = module(prev[:, :n], emb, rc, rs, self.causal[:n, :n])  # @CALL
            lg = self.lm_head(prev)
            mtp_logits.append(lg)
            tgt = targets[:, k:]  # @TARGET
            loss_mtp.append(F.cross_entropy(lg.reshape(-1, v), tgt.reshape(-1)))
        loss = loss_main + self.cfg.mtp_lambda / len(loss_mtp) * sum(loss_mtp)
        out.update(loss_main=loss_main, mtp_logits=mtp_logits, loss_mtp=loss_mtp, loss=loss)
        return out
'''


def _lm(**edits):
    lines = _LM.split("\n")
    for marker, new in edits.items():
        i = next(n for n, s in enumerate(lines) if s.rstrip().endswith(f"# @{marker}"))
        indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
        lines[i] = "\n".join(indent + part for part in new.split("\n"))
    return "\n".join(lines)


_TRAIN = '''
def train_step(model, optimizer, x, y, max_norm=1.0):
    model.train()
    optimizer.zero_grad(set_to_none=True)
    out = model(x, y)
    out["loss"].backward()
    BODY
    loads = [torch.bincount(layer.mlp.last_indices.flatten(), minlength=layer.mlp.n_routed_experts)
             for layer in model.layers if isinstance(layer.mlp, DeepSeekMoE)]
    model.update_router_biases()
    return {"loss": out["loss"].item(), "loss_main": out["loss_main"].item(),
            "loss_mtp": [v.item() for v in out["loss_mtp"]], "expert_load": loads}
'''

_FP8 = '''
def fp8_eval(model, val_data, n_batches, seed=0):
    for m in model.modules():
        if isinstance(m, DeepSeekMoE):
            m.last_indices = m.last_router_logits = None
    fp8 = copy.deepcopy(model)
    CONVERT

    def loss(m):
        was = m.training
        m.eval()
        total = 0.0
        with torch.no_grad():
            for i in range(n_batches):
                x, y = get_batch(val_data, 32, 64, torch.Generator().manual_seed(seed + i))
                lg = m(x)["logits"]
                total += F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1)).item()
        m.train(was)
        return total / n_batches

    a, b = loss(model), loss(fp8)
    return {"val_loss_fp32": a, "val_loss_fp8": b, "delta": b - a}
'''

ANSWERS = [
    # -- 17.DeepSeekLM ------------------------------------------------------------------------------------------
    Answer("17.DeepSeekLM", "MTP loss scores the token the module embeds (targets[:, :T-k])",
           _lm(TARGET="tgt = targets[:, :t - k]"), says=r"mtp|target|loss_mtp|expected", origin="issue 39"),
    Answer("17.DeepSeekLM", "MTP module inputs swapped (emb, h_prev)",
           _lm(CALL="prev = module(emb, prev[:, :n], rc, rs, self.causal[:n, :n])"),
           says=r"mtp|order|expected|differ", origin="issue 39"),
    Answer("17.DeepSeekLM", "MTP depth 1 reads the trunk state at position i+1",
           _lm(CALL="prev = module(prev[:, 1:n + 1], emb, rc, rs, self.causal[:n, :n])"),
           says=r"mtp|position|read|differ|expected"),
    Answer("17.DeepSeekLM", "load_hf_deepseek: gate and up halves swapped", '''
_load = load_hf_deepseek


def load_hf_deepseek(model, hf_state):
    swapped = {}
    for k, v in hf_state.items():
        if k.endswith("experts.gate_up_proj"):
            half = v.shape[1] // 2
            v = torch.cat([v[:, half:], v[:, :half]], 1)
        swapped[k] = v
    return _load(model, swapped)
''', says=r"transformers|hf|logits|expected|differ"),
    # -- 17.generate_latent_cached ------------------------------------------------------------------------------
    Answer("17.generate_latent_cached", "the last token fed too (one call more, one position more cached)", '''
@torch.no_grad()
def generate_latent_cached(model, idx, max_new_tokens):
    was = model.training
    model.eval()
    cache = LatentCache(len(model.layers))
    logits = model(idx, cache=cache)["logits"]
    out = [idx]
    for _ in range(max_new_tokens):
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        out.append(nxt)
        logits = model(nxt, cache=cache)["logits"]
    model.train(was)
    return torch.cat(out, 1), cache
''', says=r"cache|position|call|expected|latent"),
    Answer("17.generate_latent_cached", "the model left in eval mode", '''
_gen = generate_latent_cached


@torch.no_grad()
def generate_latent_cached(model, idx, max_new_tokens):
    tokens, cache = _gen(model, idx, max_new_tokens)
    model.eval()
    return tokens, cache
''', says=r"mode|train"),
    Answer("17.generate_latent_cached", "no cache reuse: the whole sequence re-run every step", '''
@torch.no_grad()
def generate_latent_cached(model, idx, max_new_tokens):
    was = model.training
    model.eval()
    seq = idx
    for _ in range(max_new_tokens):
        cache = LatentCache(len(model.layers))
        seq = torch.cat([seq, model(seq, cache=cache)["logits"][:, -1].argmax(-1, keepdim=True)], 1)
    cache = LatentCache(len(model.layers))
    model(seq[:, :-1], cache=cache)
    model.train(was)
    return seq, cache
''', says=r"call|single|one token|T = 1|cache|expected"),
    # -- 17.train_step ------------------------------------------------------------------------------------------
    Answer("17.train_step", "gradients clipped after optimizer.step()", _TRAIN.replace(
        "BODY", "optimizer.step()\n    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)"),
        bug="B17.clip_after_step", origin="issue 39"),
    Answer("17.train_step", "no clipping", _TRAIN.replace("BODY", "optimizer.step()"),
           says=r"clip|norm|expected"),
    Answer("17.train_step", "the MTP loss left out of the backward pass", '''
def train_step(model, optimizer, x, y, max_norm=1.0):
    model.train()
    optimizer.zero_grad(set_to_none=True)
    out = model(x, y)
    out["loss_main"].backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    loads = [torch.bincount(layer.mlp.last_indices.flatten(), minlength=layer.mlp.n_routed_experts)
             for layer in model.layers if isinstance(layer.mlp, DeepSeekMoE)]
    model.update_router_biases()
    return {"loss": out["loss"].item(), "loss_main": out["loss_main"].item(),
            "loss_mtp": [v.item() for v in out["loss_mtp"]], "expert_load": loads}
''', says=r"mtp|loss|gradient|expected"),
    # -- 17.compare_models --------------------------------------------------------------------------------------
    Answer("17.compare_models", "active parameters: every routed expert counted", '''
_cmp = compare_models


def compare_models(models, train_data, val_data, steps, batch_size, context_length, lr_fn, seed=0):
    rows = _cmp(models, train_data, val_data, steps, batch_size, context_length, lr_fn, seed)
    for r in rows:
        r["active_params"] = r["total_params"]
    return rows
''', bug="B17.active_counts_total"),
    Answer("17.compare_models", "active parameters: the shared expert left out", '''
_cmp2 = compare_models


def compare_models(models, train_data, val_data, steps, batch_size, context_length, lr_fn, seed=0):
    rows = _cmp2(models, train_data, val_data, steps, batch_size, context_length, lr_fn, seed)
    for r, m in zip(rows, models.values()):
        for mod in m.modules():
            if isinstance(mod, DeepSeekMoE):
                r["active_params"] -= sum(p.numel() for p in mod.shared_experts.parameters())
    return rows
''', says=r"active|shared|expected"),
    Answer("17.compare_models", "val_loss includes the MTP loss", '''
_cmp3 = compare_models


def compare_models(models, train_data, val_data, steps, batch_size, context_length, lr_fn, seed=0):
    rows = _cmp3(models, train_data, val_data, steps, batch_size, context_length, lr_fn, seed)
    for r, m in zip(rows, models.values()):
        if hasattr(m, "update_router_biases"):
            m.eval()
            with torch.no_grad():
                vals = []
                for i in range(10):
                    x, y = get_batch(val_data, batch_size, context_length, torch.Generator().manual_seed(10_000 + i))
                    vals.append(m(x, y)["loss"].item())
            r["val_loss"] = sum(vals) / len(vals)
    return rows
''', says=r"val_loss|main|expected"),
    # -- 17.fp8_inference ---------------------------------------------------------------------------------------
    Answer("17.fp8_inference", "only layers[0].self_attn converted",
           _FP8.replace("CONVERT", 'convert_linears_to_fp8(fp8.layers[0].self_attn, skip=("lm_head", "gate"))'),
           says=r"convert|layer|module|expected", origin="issue 39"),
    Answer("17.fp8_inference", "only the attention blocks converted", _FP8.replace(
        "CONVERT", 'for layer in fp8.layers:\n        convert_linears_to_fp8(layer.self_attn, skip=("lm_head", "gate"))'),
        says=r"convert|layer|module|expected|mlp|expert", origin="issue 39"),
    Answer("17.fp8_inference", "the whole model converted, MTP modules included",
           _FP8.replace("CONVERT", 'convert_linears_to_fp8(fp8, skip=("lm_head", "gate"))'),
           says=r"convert|mtp|module|expected"),
]
