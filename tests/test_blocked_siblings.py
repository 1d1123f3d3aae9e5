"""Library siblings of an exercise's reference are off limits too.

An exercise's reference is blocked in the worker (grader/worker.py ``block_reference``), but the library
also holds other objects that compute the same answer without going through it: a helper the reference is
built on, a fast path, an uncached twin, a visualisation's copy, a later unit's copy. A check declares them
with ``grader.runner.also_blocked``; here a submission made of the reference solution plus one cell that
delegates to each declared sibling is refused with the block message and scores 0, while the same
submission scores full marks when nothing is declared (so each case can fail, and the sibling really
answers the exercise).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import nbformat
import pytest

from grader import runner
from grader.core import CHECKS
from grader.extract import code_cells_of_notebook
from grader.runner import ALSO_BLOCKED, load_unit, run_check

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _sources(unit: str, extra: str) -> list[str]:
    nb = next((ROOT / "solutions").glob(f"{unit}_*/{unit}_*.ipynb"))
    return code_cells_of_notebook(nbformat.read(nb, as_version=4)) + [extra]


# "exercise/sibling": a cell appended to the solution (its definition replaces the solution's) that delegates
# to a sibling declared with also_blocked: refused, and a full answer without the declaration
SIBLINGS: dict[str, str] = {
    "00.noam_schedule/viz": (
        "from llmcourse.viz.essentials import noam_curve\n"
        "\n"
        "def noam_lambda(step, d_model, warmup):\n"
        "    if step < 0:\n"
        "        raise ValueError('step must be >= 0')\n"
        "    return float(noam_curve(d_model, warmup, n_steps=max(step, 1))['lr'][-1])\n"),
    "01.byte_bpe_train/split_chunks": (
        "import collections\n"
        "from llmcourse.data.bytebpe import split_chunks\n"
        "\n"
        "def byte_bpe_train(text, num_merges, special_tokens=(), pattern=GPT2_PATTERN):\n"
        "    table = collections.Counter(split_chunks(text, special_tokens, pattern))\n"
        "    words = [list(c.encode('utf-8')) for c in table]\n"
        "    counts = list(table.values())\n"
        "    pair_counts, where = full_count(words, counts)\n"
        "    merges = []\n"
        "    for k in range(num_merges):\n"
        "        if not pair_counts:\n"
        "            break\n"
        "        top = max(pair_counts.values())\n"
        "        pair = min(p for p, c in pair_counts.items() if c == top)\n"
        "        merge_step(words, counts, pair_counts, where, pair, 256 + k)\n"
        "        merges.append(pair)\n"
        "    return merges\n"),
    "01.byte_bpe_encode/encode_chunk": (
        "from llmcourse.data.bytebpe import _encode_chunk, split_chunks\n"
        "\n"
        "def byte_bpe_encode(text, merges, byte_ids=None, special_tokens=None, pattern=GPT2_PATTERN):\n"
        "    specials = dict(special_tokens or {})\n"
        "    table = list(range(256)) if byte_ids is None else list(byte_ids)\n"
        "    out = []\n"
        "    for piece in split_chunks(text, specials, pattern, keep_specials=True):\n"
        "        if piece in specials:\n"
        "            out.append(specials[piece])\n"
        "        else:\n"
        "            out.extend(_encode_chunk([table[b] for b in piece.encode('utf-8')], merges))\n"
        "    return out\n"),
    "02.sinusoidal_pe/viz": (
        "from llmcourse.viz.positions import sinusoidal_pe_float64\n"
        "\n"
        "def sinusoidal_pe(max_len, d_model):\n"
        "    return sinusoidal_pe_float64(max_len, d_model).float()\n"),
    "02.sinusoidal_pe/inverse": (
        "from llmcourse.nn.positions import inverse_frequencies\n"
        "\n"
        "def sinusoidal_pe(max_len, d_model):\n"
        "    a = torch.arange(max_len, dtype=torch.float64)[:, None] * inverse_frequencies(d_model)[None]\n"
        "    pe = torch.empty(max_len, d_model, dtype=torch.float64)\n"
        "    pe[:, 0::2] = a.sin()\n"
        "    pe[:, 1::2] = a.cos()\n"
        "    return pe.float()\n"),
    "03.simple_attention/viz": (
        "from llmcourse.viz.attention import masked_attention\n"
        "\n"
        "def simple_attention(x):\n"
        "    return masked_attention(x, x, x, scale=False, causal=False)\n"),
    "03.SelfAttention/viz": (
        "from llmcourse.viz.attention import masked_attention\n"
        "\n"
        "class SelfAttention(SelfAttention):\n"
        "    def forward(self, x):\n"
        "        return masked_attention(self.W_query(x), self.W_key(x), self.W_value(x), causal=False)[0]\n"),
    "06.chrf/statistics": (
        "from llmcourse.train.metrics import chrf_statistics\n"
        "\n"
        "def chrf(hypotheses, references, n=6, beta=2.0):\n"
        "    if beta <= 0:\n"
        "        raise ValueError('beta must be > 0')\n"
        "    ps, rs = [], []\n"
        "    for m, h, r in chrf_statistics(hypotheses, references, n):\n"
        "        if h == 0 and r == 0:\n"
        "            continue\n"
        "        ps.append(m / h if h else 0.0)\n"
        "        rs.append(m / r if r else 0.0)\n"
        "    if not ps:\n"
        "        return 0.0\n"
        "    p, r = sum(ps) / len(ps), sum(rs) / len(rs)\n"
        "    return 0.0 if p + r == 0 else 100 * (1 + beta ** 2) * p * r / (beta ** 2 * p + r)\n"),
    "08.GPT2Model/capstone": (
        "from coursetools.bench.capstone import _gpt2_cached_logits\n"
        "from llmcourse.nn.kv_cache import KVCache\n"
        "\n"
        "class GPT2Model(GPT2Model):\n"
        "    def forward(self, idx):\n"
        "        if idx.shape[1] > self.cfg.context_length:\n"
        "            raise ValueError('too long')\n"
        "        if self.training:  # the sibling has no dropout: train mode keeps the learner's own forward\n"
        "            return super().forward(idx)\n"
        "        return _gpt2_cached_logits(self, idx, KVCache(len(self.blocks)))\n"),
    "09.sample_next_token/filtered": (
        "from llmcourse.train.sampling import filtered_probs\n"
        "\n"
        "def sample_next_token(logits, temperature=1.0, top_k=None, top_p=None, generator=None):\n"
        "    if temperature == 0:\n"
        "        return logits.argmax(dim=-1, keepdim=True)\n"
        "    return torch.multinomial(filtered_probs(logits, temperature, top_k, top_p), 1, generator=generator)\n"),
    "09.generate_batched/padded": (
        "from llmcourse.train.sampling import padded_batch\n"
        "\n"
        "@torch.no_grad()\n"
        "def generate_batched(model, prompts, max_new_tokens, context_length, pad_id=0, temperature=0.0, top_k=None,\n"
        "                     top_p=None, eos_id=None, generator=None):\n"
        "    idx, mask, pos = padded_batch(prompts, pad_id)\n"
        "    t0 = idx.shape[1]\n"
        "    if t0 + max_new_tokens > context_length:\n"
        "        raise ValueError('too long')\n"
        "    was = model.training\n"
        "    model.eval()\n"
        "    done = torch.zeros(len(prompts), dtype=torch.bool)\n"
        "    for _ in range(max_new_tokens):\n"
        "        nxt = sample_next_token(model(idx, attention_mask=mask, position_ids=pos)[:, -1], temperature, top_k,\n"
        "                                top_p, generator)\n"
        "        if eos_id is not None:\n"
        "            nxt = torch.where(done[:, None], torch.full_like(nxt, eos_id), nxt)\n"
        "            done = done | (nxt[:, 0] == eos_id)\n"
        "        idx = torch.cat([idx, nxt], 1)\n"
        "        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)\n"
        "        pos = torch.cat([pos, pos[:, -1:] + 1], 1)\n"
        "        if eos_id is not None and bool(done.all()):\n"
        "            break\n"
        "    model.train(was)\n"
        "    return idx[:, t0:]\n"),
    "10.configure_optimizer/groups": (
        "from llmcourse.train.optim import parameter_groups\n"
        "\n"
        "def configure_optimizer(model, lr, weight_decay=0.1, betas=(0.9, 0.95)):\n"
        "    d, n = parameter_groups(model)\n"
        "    return torch.optim.AdamW([{'params': [p for _, p in d], 'weight_decay': weight_decay},\n"
        "                              {'params': [p for _, p in n], 'weight_decay': 0.0}], lr=lr, betas=betas)\n"),
    "10.train_steps/train_step": (
        "from llmcourse.train.pretraining import train_step as _ts\n"
        "\n"
        "def train_steps(model, optimizer, data, n_steps, start_step, batch_size, context_length, lr_fn, max_norm, seed):\n"
        "    model.train()\n"
        "    out = []\n"
        "    for s in range(start_step, start_step + n_steps):\n"
        "        x, y = get_batch(data, batch_size, context_length, torch.Generator().manual_seed(seed + s))\n"
        "        out.append(_ts(model, optimizer, x, y, lr_fn(s), max_norm)[0])\n"
        "    return out\n"),
    "10.train_steps/_val_loss": (
        "from llmcourse.models.deepseek import _val_loss\n"
        "\n"
        "def estimate_loss(model, data, batch_size, context_length, n_batches, seed=0):\n"
        "    return _val_loss(model, data, batch_size, context_length, n_batches, seed)\n"),
    "11.Llama3Model/mtp_trunk": (
        "from types import SimpleNamespace\n"
        "from llmcourse.models.mtp import MTPLanguageModel as _M\n"
        "\n"
        "class Llama3Model(Llama3Model):\n"
        "    def _check(self, idx):\n"
        "        if idx.shape[1] > self.cfg.context_length:\n"
        "            raise ValueError('too long')\n"
        "        return idx.shape[1]\n"
        "\n"
        "    def forward(self, idx):\n"
        "        return self.lm_head(self.norm(_M.trunk(SimpleNamespace(model=self), idx)))\n"),
    "12.generate_cached/capstone": (
        "from coursetools.bench.capstone import _greedy_with_cache\n"
        "\n"
        "def generate_cached(model, idx, max_new_tokens, eos_id=None):\n"
        "    if max_new_tokens == 0:\n"
        "        return idx\n"
        "    with torch.no_grad():\n"
        "        toks, _ = _greedy_with_cache(lambda i, c: model(i, cache=c), model.new_cache(), idx, max_new_tokens)\n"
        "    if eos_id is not None:  # the EOS rule around the sibling (rows are independent in greedy decoding)\n"
        "        new = toks[:, idx.shape[1]:]\n"
        "        done = (new == eos_id).int().cummax(dim=1).values.bool()\n"
        "        after = torch.zeros_like(done)\n"
        "        after[:, 1:] = done[:, :-1]\n"
        "        new = new.masked_fill(after, eos_id)\n"
        "        finished = done.all(0).nonzero()\n"
        "        if len(finished):\n"
        "            new = new[:, :int(finished[0]) + 1]\n"
        "        toks = torch.cat([idx, new], dim=1)\n"
        "    return toks\n"),
    "12.kv_cache_bytes/elements": (
        "from llmcourse.nn.kv_cache import kv_elements_per_token\n"
        "\n"
        "def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_elem=2):\n"
        "    return kv_elements_per_token(n_layers, n_kv_heads, head_dim) * seq_len * batch_size * bytes_per_elem\n"),
    "12.kv_cache_bytes/attn_elems": (
        "from llmcourse.nn.kv_cache import attn_cache_elems_per_token\n"
        "\n"
        "def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_elem=2):\n"
        "    return attn_cache_elems_per_token('gqa', n_layers, n_kv_heads=n_kv_heads, head_dim=head_dim) * seq_len * batch_size * bytes_per_elem\n"),
    "12.kv_cache_bytes/viz": (
        "from llmcourse.viz.llama import kv_bytes_per_token\n"
        "\n"
        "def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_elem=2):\n"
        "    return kv_bytes_per_token(n_layers, n_kv_heads, head_dim, bytes_per_elem) * seq_len * batch_size\n"),
    "13.SimpleMLA/absorbed": (
        "from llmcourse.models.deepseek_mla import absorbed_forward\n"
        "\n"
        "class SimpleMLA(SimpleMLA):\n"
        "    def forward(self, x, mask, cache=None, layer_idx=0):\n"
        "        c = self.W_dkv(x)\n"
        "        if cache is not None:\n"
        "            c, _ = cache.update(layer_idx, c)\n"
        "        return absorbed_forward(self, x, c, mask)\n"),
    "17.DeepSeekLM/state_dict_from_hf": (
        "from llmcourse.models.deepseek import deepseek_state_dict_from_hf as _sd\n"
        "\n"
        "def load_hf_deepseek(model, hf_state):\n"
        "    sd = _sd(hf_state)\n"
        "    if model.cfg.tie_word_embeddings:\n"
        "        sd.setdefault('lm_head.weight', sd.get('embed_tokens.weight'))\n"
        "    missing, unexpected = model.load_state_dict(sd, strict=False)\n"
        "    missing = [k for k in missing if not k.startswith('mtp.')]\n"
        "    if missing or unexpected:\n"
        "        raise KeyError(f'mismatch {missing[:5]} {unexpected[:5]}')\n"
        "    return model\n"),
    "17.generate_latent_cached/capstone": (
        "from coursetools.bench.capstone import _greedy_with_cache\n"
        "from llmcourse.models.deepseek_mla import LatentCache\n"
        "\n"
        "def generate_latent_cached(model, idx, max_new_tokens):\n"
        "    if max_new_tokens == 0:\n"
        "        return idx, LatentCache(len(model.layers))\n"
        "    was = model.training\n"
        "    model.eval()\n"
        "    with torch.no_grad():\n"
        "        out = _greedy_with_cache(lambda i, c: model(i, cache=c)['logits'], LatentCache(len(model.layers)), idx, max_new_tokens)\n"
        "    model.train(was)\n"
        "    return out\n"),
    "17.fp8_inference/_val_loss": (
        "import copy\n"
        "from llmcourse.models.deepseek import _val_loss\n"
        "from llmcourse.quant.fp8 import convert_linears_to_fp8\n"
        "\n"
        "from llmcourse.models.deepseek import DeepSeekMoE\n"
        "\n"
        "def fp8_eval(model, val_data, n_batches, seed=0, *, batch_size=32, context_length=64):\n"
        "    for m in model.modules():  # the routers' last outputs are not graph leaves: deepcopy refuses them\n"
        "        if isinstance(m, DeepSeekMoE):\n"
        "            m.last_indices = m.last_router_logits = None\n"
        "    fp8 = copy.deepcopy(model)\n"
        "    convert_linears_to_fp8(fp8.layers, skip=('lm_head', 'gate'))\n"
        "    a = _val_loss(model, val_data, batch_size, context_length, n_batches, seed)\n"
        "    b = _val_loss(fp8, val_data, batch_size, context_length, n_batches, seed)\n"
        "    return {'val_loss_fp32': a, 'val_loss_fp8': b, 'delta': b - a}\n"),
    "18.attach_data_parallel/bucketed": (
        "import torch\n"
        "import torch.distributed as dist\n"
        "from llmcourse.parallel.data_parallel import BucketedDataParallel\n"
        "\n"
        "def attach_data_parallel(module, seed):\n"
        "    BucketedDataParallel(module, bucket_cap_mb=0)   # its hooks keep it alive\n"
        "    torch.manual_seed(seed + dist.get_rank())\n"),
    "18.row_parallel_linear/layer": (
        "from llmcourse.parallel.tensor_parallel import RowParallelLinear\n"
        "\n"
        "def row_parallel_linear(x, linear, rank, world_size):\n"
        "    n = linear.in_features // world_size\n"
        "    layer = RowParallelLinear.from_linear(linear, rank, world_size)\n"
        "    del layer.weight, layer.bias  # the given layer's own tensors, so that its gradients arrive\n"
        "    layer.weight, layer.bias = linear.weight[:, rank * n:(rank + 1) * n], linear.bias\n"
        "    return layer(x[..., rank * n:(rank + 1) * n])\n"),
    "18.tp_swiglu/block": (
        "from llmcourse.parallel.tensor_parallel import TensorParallelSwiGLU\n"
        "\n"
        "def tp_swiglu(x, ff, rank, world_size):\n"
        "    n = ff.gate_proj.out_features // world_size\n"
        "    mine = slice(rank * n, (rank + 1) * n)\n"
        "    block = TensorParallelSwiGLU(ff.gate_proj.in_features, ff.gate_proj.out_features, rank, world_size)\n"
        "    del block.gate_proj.weight, block.up_proj.weight, block.down_proj.weight  # the given block's tensors\n"
        "    block.gate_proj.weight, block.up_proj.weight = ff.gate_proj.weight[mine], ff.up_proj.weight[mine]\n"
        "    block.down_proj.weight = ff.down_proj.weight[:, mine]\n"
        "    return block(x)\n"),
    "18.tp_swiglu/enter": (
        "import torch.distributed as dist\n"
        "import torch.nn.functional as F\n"
        "from llmcourse.parallel.tensor_parallel import copy_to_tensor_parallel\n"
        "\n"
        "def tp_swiglu(x, ff, rank, world_size):\n"
        "    n = ff.gate_proj.out_features // world_size\n"
        "    mine = slice(rank * n, (rank + 1) * n)\n"
        "    x = copy_to_tensor_parallel(x)\n"
        "    out = F.linear(F.silu(F.linear(x, ff.gate_proj.weight[mine])) * F.linear(x, ff.up_proj.weight[mine]),\n"
        "                   ff.down_proj.weight[:, mine])\n"
        "    dist.all_reduce(out)\n"
        "    return out\n"),
    "18.expert_parallel_moe/layer": (
        "from llmcourse.parallel.expert_parallel import ExpertParallelMoE\n"
        "\n"
        "def expert_parallel_moe(x, moe, rank, world_size):\n"
        "    return ExpertParallelMoE.from_moe(moe, rank, world_size)(x)\n"),
    "19.addition_reward/parse": (
        "from llmcourse.post.task import parse_completion\n"
        "\n"
        "def addition_reward(completion, answer, correct_weight=1.0, format_weight=0.1):\n"
        "    value = parse_completion(completion)\n"
        "    if value is None:\n"
        "        return 0.0\n"
        "    return float(format_weight) + (float(correct_weight) if value == answer else 0.0)\n"),
    "19.sft_loss/labels": (
        "import torch.nn.functional as F\n"
        "from llmcourse.post.sft import sft_labels\n"
        "\n"
        "def sft_loss(logits, ids, prompt_len, pad_id):\n"
        "    if tuple(logits.shape[:2]) != tuple(ids.shape):\n"
        "        raise ValueError('shapes')\n"
        "    labels = sft_labels(ids, prompt_len, pad_id)\n"
        "    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels.reshape(-1))\n"),
    "19.grpo_loss/k3": (
        "from llmcourse.post.grpo import kl_k3\n"
        "\n"
        "def grpo_loss(logps, old_logps, ref_logps, advantages, mask, clip_eps=0.2, beta=0.04):\n"
        "    if logps.dim() != 2 or any(x.shape != logps.shape for x in (old_logps, ref_logps, mask)):\n"
        "        raise ValueError('shapes')\n"
        "    if tuple(advantages.shape) != (logps.shape[0],):\n"
        "        raise ValueError('advantages')\n"
        "    ratio = torch.exp(logps - old_logps.detach())\n"
        "    a = advantages[:, None]\n"
        "    term = torch.minimum(ratio * a, ratio.clamp(1 - clip_eps, 1 + clip_eps) * a)\n"
        "    term = term - beta * kl_k3(logps, ref_logps.detach())\n"
        "    m = mask.float()\n"
        "    return -((term * m).sum(1) / m.sum(1).clamp(min=1)).mean()\n"),
}

# siblings that reach the reference itself (a method of the blocked class, a library class built on the
# reference, a wrapper that calls it): refused with no declaration
THROUGH_THE_REFERENCE: dict[str, str] = {
    "12.kv_cache_bytes/roofline": (
        "from types import SimpleNamespace\n"
        "from llmcourse.nn.kv_cache import decode_step_bytes\n"
        "\n"
        "def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_elem=2):\n"
        "    c = SimpleNamespace(vocab_size=0, d_model=head_dim, n_heads=1, n_kv_heads=n_kv_heads, n_layers=n_layers)\n"
        "    return decode_step_bytes(c, -batch_size * head_dim, batch_size, seq_len, bytes_per_elem)\n"),
    "04.MultiHeadAttention/fused": (
        "import torch.nn.functional as F\n"
        "from llmcourse.nn.multihead import MultiHeadAttention as _M\n"
        "\n"
        "class MultiHeadAttention(MultiHeadAttention):\n"
        "    def _split(self, x):\n"
        "        b, t, _ = x.shape\n"
        "        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)\n"
        "\n"
        "    def forward(self, x_q, x_kv=None, mask=None):\n"
        "        q, k, v = _M._fused_qkv(self, x_q)\n"
        "        o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)\n"
        "        return self.out_proj(o.transpose(1, 2).reshape(x_q.shape[0], x_q.shape[1], self.d_out))\n"),
    "14.deepseek_route/router": (
        "from llmcourse.models.deepseek_moe import DeepSeekTopkRouter\n"
        "\n"
        "def deepseek_route(router_logits, bias, top_k, n_group, topk_group, routed_scaling_factor=1.0, norm_topk_prob=True):\n"
        "    r = DeepSeekTopkRouter(router_logits.shape[-1], router_logits.shape[-1], top_k, n_group, topk_group, routed_scaling_factor, norm_topk_prob)\n"
        "    r.weight.data = torch.eye(router_logits.shape[-1])\n"
        "    r.e_score_correction_bias.copy_(bias)\n"
        "    return r(router_logits)[1:]\n"),
    "15.speculative_generate/trace": (
        "from llmcourse.models.mtp import speculative_trace\n"
        "\n"
        "def speculative_generate(model, idx, max_new_tokens):\n"
        "    r = speculative_trace(model, idx, max_new_tokens)\n"
        "    return r['tokens'], r['rate']\n"),
}


# declared without a case of their own: the same sibling as a tested exercise of the unit (masked_attention),
# a helper only the tested sibling calls (_bpe_iter, _read_ranks, _ngrams, absorb_mla_weights,
# reduce_from_tensor_parallel, _CopyToTP), an unbucketed twin that needs the learner's own hooks around it to answer
# (average_gradients), or a forward that needs more of the learner's own code around it to answer (unit 12's cached
# classes; ColumnParallelLinear, whose layers each sum ∂x, one backward all-reduce too many for the block)
_DECLARED_WITHOUT_A_CASE = {
    ("01.byte_bpe_train", "_chunk_table"), ("01.byte_bpe_train", "_special_regex"),
    ("01.byte_bpe_encode", "_special_regex"), ("06.chrf", "_ngrams"),
    ("03.scaled_dot_product_attention", "masked_attention"), ("03.CausalSelfAttention", "masked_attention"),
    ("11.Llama3Model", "CachedLlama3Model"), ("11.Llama3Model", "CachedLlama3Block"),
    ("13.SimpleMLA", "absorb_mla_weights"), ("17.compare_models", "_val_loss"),
    ("18.row_parallel_linear", "reduce_from_tensor_parallel"), ("18.attach_data_parallel", "average_gradients"),
    ("18.tp_swiglu", "_CopyToTP"), ("18.tp_swiglu", "ColumnParallelLinear"),
}


@pytest.mark.parametrize("case", sorted(SIBLINGS))
def test_a_submission_that_delegates_to_a_sibling_scores_0(case, monkeypatch):
    exercise_id = case.split("/")[0]
    sources = _sources(exercise_id[:2], SIBLINGS[case])
    verdict = run_check(exercise_id, sources)
    assert verdict.points == 0 and "course library's own answer" in verdict.render(), verdict.render()
    # control: without the declaration the delegation is a full answer
    monkeypatch.setattr(runner, "ALSO_BLOCKED", {})
    control = run_check(exercise_id, sources)
    assert control.points == control.max_points > 0, control.render()


@pytest.mark.parametrize("case", sorted(THROUGH_THE_REFERENCE))
def test_a_sibling_that_goes_through_the_reference_is_refused(case):
    exercise_id = case.split("/")[0]
    verdict = run_check(exercise_id, _sources(exercise_id[:2], THROUGH_THE_REFERENCE[case]))
    assert verdict.points == 0 and "course library's own answer" in verdict.render(), verdict.render()


def test_every_declared_sibling_is_tested():
    for n in range(20):
        load_unit(f"{n:02d}")
    declared = {(ex, target.rpartition(":")[2].split(".")[-1]) for ex, targets in ALSO_BLOCKED.items()
                for target in targets}
    tested = {(case.split("/")[0], SIBLINGS[case]) for case in SIBLINGS}
    untested = sorted((ex, name) for ex, name in declared
                      if not any(e == ex and name in src for e, src in tested))
    assert not untested or set(untested) <= _DECLARED_WITHOUT_A_CASE, untested


def test_every_declared_sibling_exists_and_is_not_the_reference():
    for n in range(20):
        load_unit(f"{n:02d}")
    assert ALSO_BLOCKED
    for exercise_id, targets in ALSO_BLOCKED.items():
        spec = CHECKS[exercise_id]
        refs = {(getattr(o, "__module__", ""), getattr(o, "__qualname__", "")) for o in spec.reference().values()}
        for target in targets:
            module, _, qualname = target.partition(":")
            obj = importlib.import_module(module)
            for part in qualname.split("."):
                obj = getattr(obj, part)  # AttributeError: a stale declaration (renamed or removed)
            assert (module, qualname) not in refs, f"{exercise_id}: {target} is already its reference"


def test_a_sibling_in_a_module_not_yet_imported_is_blocked_when_it_is_imported():
    """The worker does not import a sibling's module (llmcourse.viz pulls in matplotlib): it blocks the
    sibling as soon as learner code imports the module, and an unrelated object of it stays usable."""
    import torch

    from grader.worker import LearnerProcess

    src = ("import sys\nimport torch\n\ndef imported():\n    return 'llmcourse.viz.attention' in sys.modules\n\n"
           "def use(name):\n    import llmcourse.viz.attention as V\n    x = torch.ones(1, 3, 2)\n"
           "    return V.masked_attention(x, x, x)[0] if name == 'masked' else V.softmax_sharpness(1.0)[0]\n")
    blocked = [("llmcourse.viz.attention", "masked_attention")]
    with LearnerProcess([src], blocked) as proc:
        assert proc.call(lambda impl: impl.imported()) is False
        assert proc.call(lambda impl: impl.use("other")).shape == (5,)
        assert proc.call(lambda impl: impl.imported()) is True
        with pytest.raises(Exception, match="course library's own answer"):
            proc.call(lambda impl: impl.use("masked"))
    with LearnerProcess([src], []) as proc:  # control: unblocked, it answers
        assert torch.equal(proc.call(lambda impl: impl.use("masked")), torch.ones(1, 3, 2))
