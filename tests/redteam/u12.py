"""Unit 12 red-team corpus (see tests/redteam/__init__.py)."""

from tests.redteam import Answer
from tests.redteam.edits import edited

U = "12"
TABLES = "cos, sin = self.rope_cos[start:start + T], self.rope_sin[start:start + T]"
MASK = "mask = self.causal[start:start + T, :start + T]"
FREEZE = ("        if eos_id is not None:\n            nxt = torch.where(done[:, None], torch.full_like(nxt, eos_id), nxt)\n"
          "            done = done | (nxt[:, 0] == eos_id)\n")
BYTES = "2 * n_layers * n_kv_heads * head_dim * seq_len * batch_size * bytes_per_elem"
GROUPS = "w.reshape(n_kv_heads, n_heads // n_kv_heads, hd, w.shape[1]).mean(dim=1)"

ANSWERS = [
    # ---------------------------------------------------------------- 12.KVCache
    Answer("12.KVCache", "appends along the head dimension (dim 1)", edited(U, "KVCache", ("dim=2)", "dim=1)")),
           says=r"KVCache.update. raised RuntimeError"),
    Answer("12.KVCache", "seq_len counts update calls", edited(U, "KVCache",
           ("        if self.keys[layer_idx] is not None:\n",
            "        self.calls = getattr(self, 'calls', 0) + (layer_idx == 0)\n"
            "        if self.keys[layer_idx] is not None:\n"),
           ("return 0 if self.keys[0] is None else self.keys[0].shape[2]",
            "return getattr(self, 'calls', 0) if self.keys[0] is not None else 0")),
           says=r"seq_len after appending chunks"),
    Answer("12.KVCache", "nbytes assumes 4 bytes per element", edited(U, "KVCache",
           ("t.numel() * t.element_size()", "t.numel() * 4")), says=r"must count 2 bytes per element"),
    # ---------------------------------------------------------------- 12.cached_forward
    Answer("12.cached_forward", "new tokens take the RoPE rows from 0", edited(U, "Llama3Model",
           (TABLES, "cos, sin = self.rope_cos[:T], self.rope_sin[:T]")), bug="B12.positions_restart"),
    Answer("12.cached_forward", "the mask is the square causal mask of the new tokens", edited(U, "Llama3Model",
           (MASK, "mask = self.causal[:T, :T] if start == 0 else torch.ones(T, start + T, dtype=torch.bool)")),
           says=r"chunked prefill"),
    Answer("12.cached_forward", "no mask over the cache (every query sees every key)", edited(U, "Llama3Model",
           (MASK, "mask = torch.ones(T, start + T, dtype=torch.bool)")), says=r"without a cache"),
    # ---------------------------------------------------------------- 12.generate_cached
    Answer("12.generate_cached", "re-runs the whole sequence at every step (through the cache)",
           edited(U, "generate_cached",
                  ("    logits = model(idx, cache=cache)\n    for step in range(max_new_tokens):\n",
                   "    for step in range(max_new_tokens):\n        cache.reset()\n"
                   "        logits = model(idx, cache=cache)\n"),
                  ("        logits = model(nxt, cache=cache)\n", "")), bug="B12.rerun_sequence", origin="issue 38"),
    Answer("12.generate_cached", "no EOS freezing (rows continue after EOS)", edited(U, "generate_cached",
           (FREEZE, ""), (" or (eos_id is not None and bool(done.all()))", "")), bug="B12.eos_ignored"),
    Answer("12.generate_cached", "one cache shared by every call (module-level)", "_SHARED = {}\n\n\n"
           + edited(U, "generate_cached", ("cache = KVCache(len(model.layers))",
                                           "cache = _SHARED.setdefault(id(model), KVCache(len(model.layers)))")),
           bug="B12.no_reset"),
    # ---------------------------------------------------------------- 12.kv_cache_bytes
    Answer("12.kv_cache_bytes", "keys only (no factor 2 for K and V)", edited(U, "kv_cache_bytes",
           (BYTES, BYTES.removeprefix("2 * "))), bug="B12.bytes_no_factor2"),
    Answer("12.kv_cache_bytes", "batch size forgotten", edited(U, "kv_cache_bytes",
           (BYTES, BYTES.replace(" * batch_size", ""))), bug="B12.bytes_ignores_batch"),
    Answer("12.kv_cache_bytes", "returns a float (GB-style division)", edited(U, "kv_cache_bytes",
           (BYTES, "2.0" + BYTES.removeprefix("2") + " / 1.0")), says=r"must return an int"),
    # ---------------------------------------------------------------- 12.mha_to_gqa
    Answer("12.mha_to_gqa", "strided groups (head h joins group h mod KV)", edited(U, "mha_to_gqa",
           (GROUPS, "w.reshape(n_heads // n_kv_heads, n_kv_heads, hd, w.shape[1]).mean(dim=0)")),
           bug="B12.gqa_strided_groups"),
    Answer("12.mha_to_gqa", "keeps the first head of each group (no mean)", edited(U, "mha_to_gqa",
           (GROUPS, GROUPS.replace(".mean(dim=1)", "[:, 0]"))), says=r"the mean over all heads"),
]
