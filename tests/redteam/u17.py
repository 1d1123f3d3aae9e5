"""Red-team answers for unit 17 (the DeepSeek capstone): written from the released exercise notebook."""

from tests.redteam import Answer
from tests.redteam.edits import edited, solution_def

U = "17"


def _lm(*edits):
    return edited(U, "DeepSeekLM", *edits)


_MTP_CALL = "prev = module(prev[:, :n], self.embed_tokens(idx[:, k:]),"
_CLIP = "    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n"
_CONVERT = 'convert_linears_to_fp8(fp8.layers, skip=("lm_head", "gate"))'


def _fp8(new):
    return edited(U, "fp8_eval", (_CONVERT, new))


ANSWERS = [
    # -- 17.DeepSeekLM ------------------------------------------------------------------------------------------
    Answer("17.DeepSeekLM", "MTP loss scores the token the module embeds (targets[:, :T-k])",
           _lm(("targets[:, k:].reshape(-1)", "targets[:, :t - k].reshape(-1)")), says=r"mtp|target|loss_mtp|expected", origin="issue 39"),
    Answer("17.DeepSeekLM", "MTP module inputs swapped (emb, h_prev)",
           _lm((_MTP_CALL, "prev = module(self.embed_tokens(idx[:, k:]), prev[:, :n],")),
           says=r"mtp|order|expected|differ", origin="issue 39"),
    Answer("17.DeepSeekLM", "MTP depth 1 reads the trunk state at position i+1",
           _lm((_MTP_CALL, "prev = module(prev[:, 1:n + 1], self.embed_tokens(idx[:, k:]),")),
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
    Answer("17.DeepSeekLM", "the MTP losses summed with λ, not averaged over the depths", _lm(
        ("self.cfg.mtp_lambda / len(loss_mtp) * sum(loss_mtp)", "self.cfg.mtp_lambda * sum(loss_mtp)")),
        says=r"mtp_lambda|λ/D"),
    Answer("17.DeepSeekLM", "cached tokens given the RoPE rows of positions 0… (the offset forgotten)", _lm(
        ("cos, sin = self.rope_cos[past:past + t], self.rope_sin[past:past + t]",
         "cos, sin = self.rope_cos[:t], self.rope_sin[:t]")), says=r"LatentCache|positions"),
    Answer("17.DeepSeekLM", "weights left at PyTorch's default initialisation", _lm(
        ("nn.init.normal_(m.weight, std=0.02)", "pass")), says=r"N\(0, 0\.02"),
    Answer("17.DeepSeekLM", "rope_interleave hard-coded", edited(U, "DeepSeekBlock",
           ("cfg.rope_theta, cfg.rope_interleave,", "cfg.rope_theta, True,")) + solution_def(U, "DeepSeekLM"),
           says=r"DeepSeekConfig field"),
    # -- 17.generate_latent_cached ------------------------------------------------------------------------------
    Answer("17.generate_latent_cached", "the last token fed too (one call more, one position more cached)",
           edited(U, "generate_latent_cached", ("if step < max_new_tokens - 1:", "if True:")),
           says=r"cache|position|call|expected|latent"),
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
    Answer("17.generate_latent_cached", "decoding in the mode the model came in", edited(
        U, "generate_latent_cached", ("    model.eval()\n", "")), bug="B17.decode_in_train_mode"),
    Answer("17.generate_latent_cached", "nothing generated for one new token (prefill only from two)", edited(
        U, "generate_latent_cached", ("if max_new_tokens > 0:", "if max_new_tokens > 1:")), says=r"max_new_tokens=1"),
    # -- 17.train_step ------------------------------------------------------------------------------------------
    Answer("17.train_step", "gradients clipped after optimizer.step()", edited(
        U, "train_step", (_CLIP + "    optimizer.step()\n", "    optimizer.step()\n" + _CLIP)),
        bug="B17.clip_after_step", origin="issue 39"),
    Answer("17.train_step", "no clipping", edited(U, "train_step", (_CLIP, "")), says=r"clip|norm|expected"),
    Answer("17.train_step", "the MTP loss left out of the backward pass", edited(
        U, "train_step", ('out["loss"].backward()', 'out["loss_main"].backward()')), says=r"mtp|loss|gradient|expected"),
    Answer("17.train_step", "gradients never cleared (accumulate across steps)", edited(
        U, "train_step", ("    optimizer.zero_grad(set_to_none=True)\n", "")), bug="B17.grads_accumulated"),
    Answer("17.train_step", "the model's mode left as handed over", edited(U, "train_step", ("    model.train()\n", "")),
           bug="B17.step_in_eval_mode"),
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
    Answer("17.compare_models", "ms_per_step: the total time, not the mean per step", edited(
        U, "compare_models", ('"ms_per_step": 1000 * spent / max(steps, 1)', '"ms_per_step": 1000 * spent')),
        says=r"ms_per_step"),
    Answer("17.compare_models", "dense models trained without clipping", edited(
        U, "compare_models", ("                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n", "")),
        says=r"clipped to 1\.0"),
    Answer("17.compare_models", "validation in training mode", edited(U, "compare_models", ("        model.eval()\n", ""))
           , says=r"validation forwards ran in training mode"),
    Answer("17.compare_models", "the cache size as a float (head_dim = d_model / n_heads)", edited(
        U, "compare_models", ("head_dim=c.d_model // c.n_heads)\n", "head_dim=c.d_model / c.n_heads)\n")),
        says=r"ints"),
    # -- 17.fp8_inference ---------------------------------------------------------------------------------------
    Answer("17.fp8_inference", "only layers[0].self_attn converted",
           _fp8('convert_linears_to_fp8(fp8.layers[0].self_attn, skip=("lm_head", "gate"))'),
           says=r"convert|layer|module|expected", origin="issue 39"),
    Answer("17.fp8_inference", "only the attention blocks converted", _fp8(
        'for layer in fp8.layers:\n        convert_linears_to_fp8(layer.self_attn, skip=("lm_head", "gate"))'),
        says=r"convert|layer|module|expected|mlp|expert", origin="issue 39"),
    Answer("17.fp8_inference", "the whole model converted, MTP modules included",
           _fp8('convert_linears_to_fp8(fp8, skip=("lm_head", "gate"))'),
           says=r"convert|mtp|module|expected"),
    Answer("17.fp8_inference", "losses measured in the mode the model came in", edited(
        U, "fp8_eval", ("        m.eval()\n", "")), says=r"eval mode"),
]
