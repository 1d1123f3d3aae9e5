"""Unit 17 widgets: the compute helpers and the static fallbacks of W17.1–W17.3."""

from __future__ import annotations

import torch

from llmcourse.models import GPT2Config, GPT2Model
from llmcourse.models.deepseek import DeepSeekConfig, DeepSeekLM
from llmcourse.viz import capstone as viz

SMALL = dict(d_model=32, n_heads=2, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
             intermediate_size=64, moe_intermediate_size=16)


class _Tok:
    def encode(self, s):
        return [ord(c) % 65 for c in s]

    def decode(self, ids):
        return "".join(chr(65 + i % 26) for i in ids)


def test_smooth():
    assert viz.smooth([1.0, 3.0, 5.0], 2) == [1.0, 2.0, 4.0]
    assert viz.smooth([1.0, 2.0], 1) == [1.0, 2.0]


def test_generation_record_reads_the_latent_cache():
    torch.manual_seed(0)
    ds = DeepSeekLM(DeepSeekConfig(**SMALL)).eval()
    gpt = GPT2Model(GPT2Config(vocab_size=65, context_length=64, d_model=32, n_heads=2, n_layers=2, dropout=0.0)).eval()
    rec = viz.generation_record({"ds": ds, "gpt": gpt}, _Tok(), "ROMEO:", 5)
    assert rec["measured"] == "ds"
    assert rec["bytes_per_token"]["ds"] == 4 * (16 + 4) * 4          # L·(d_c + d_R)·4 bytes
    assert rec["bytes_per_token"]["gpt"] == 2 * 2 * 2 * 16 * 4        # L·H·2·hd·4 bytes
    assert len(rec["text"]["ds"]) == 5


def test_static_fallbacks():
    rows = [{"name": n, "total_params": t, "active_params": a, "ms_per_step": 10.0, "val_loss": 2.5,
             "cache_elems_per_token": c} for n, t, a, c in [("a", 10, 10, 1024), ("b", 20, 8, 320)]]
    curves = {"a": [3.0, 2.5, 2.0], "b": [3.1, 2.4, 2.1], "mtp": [3.3, 2.9, 2.6]}
    loads = {"bias update on": [1.5, 1.3, 1.2], "bias update off": [1.6, 1.7, 1.8]}
    rec = {"prompt": "ROMEO:", "text": {"a": "xyz", "b": "abc"}, "bytes_per_token": {"a": 4096, "b": 1280},
           "measured": "b"}
    figs = [viz.show_capstone_dashboard(curves, loads, {"a": 10.0, "b": 20.0}, 2048, static=True),
            viz.show_generation_panel({}, _Tok(), rec, static=True),
            viz.show_comparison_table(rows, 0.01, static=True)]
    for fig, wid in zip(figs, ["W17.1", "W17.2", "W17.3"]):
        assert fig.widget_id == wid
        assert fig._repr_png_()[:4] == b"\x89PNG"


def test_generation_record_stops_at_the_trained_window():
    """The panel never asks a model for positions beyond the window it was trained on."""
    torch.manual_seed(0)
    ds = DeepSeekLM(DeepSeekConfig(**SMALL)).eval()
    rec = viz.generation_record({"ds": ds}, _Tok(), "ROMEO:", 50, context_length=16)
    assert rec["new_tokens"] == 16 - 6 and len(rec["text"]["ds"]) == 10
    assert viz.generation_record({"ds": ds}, _Tok(), "ROMEO:", 5, context_length=16)["new_tokens"] == 5


def test_capstone_lesson_generates_inside_the_assets_trained_window():
    """The asset was trained on 64-token windows while its config allows 256 positions: the lesson must cap the
    latent-cache generation and the panel at the trained window, in every profile."""
    from pathlib import Path

    src = (Path(__file__).resolve().parents[1] / "notebooks/lessons/17_deepseek_capstone.py").read_text()
    assert 'n_gen = min(cfg["gen_tokens"], trained_ctx - prompt.shape[1])' in src
    assert "context_length=T)" in src
    from llmcourse.train.deepseek_char import DEEPSEEK_CHAR_TINY_RECIPE

    assert DEEPSEEK_CHAR_TINY_RECIPE["context_length"] < DeepSeekConfig().context_length   # why the cap is needed


def test_forward_time_breakdown_attributes_every_part():
    from llmcourse.models.deepseek import forward_time_breakdown

    torch.manual_seed(0)
    m = DeepSeekLM(DeepSeekConfig(**SMALL)).eval()
    x = torch.randint(0, 65, (2, 12))
    parts = forward_time_breakdown(m, x[:, :-1], x[:, 1:], repeats=1)
    assert parts["total"] > 0 and abs(sum(v for k, v in parts.items() if k != "total") - parts["total"]) < 1e-6
    for key in ("attention", "dense FFN", "MoE router", "MoE expert GEMMs", "MTP module"):
        assert parts[key] > 0, key
    assert forward_time_breakdown(m, x, repeats=1)["MTP module"] == 0.0         # no targets: no MTP pass
    assert not any(h for mod in m.modules() for h in (mod._forward_hooks, mod._forward_pre_hooks))   # hooks removed


def test_generation_lengths_of_every_profile_fit_the_trained_window():
    from llmcourse.runtime import profile
    from llmcourse.train.deepseek_char import DEEPSEEK_CHAR_TINY_RECIPE

    for name in ("ci", "laptop", "gpu"):
        p = profile("17", name)
        assert len("ROMEO:") + p["gen_tokens"] <= DEEPSEEK_CHAR_TINY_RECIPE["context_length"], name
        assert len("ROMEO:") + p["panel_tokens"] <= p["context_length"], name


def test_comparison_table_flops_column_and_cost_rows():
    """GFLOP/step appears only when a row has it; a cost-only row (no val loss, no counts) shows dashes and sorts last."""
    rows = [{"name": "a", "total_params": 10, "active_params": 10, "ms_per_step": 10.0, "val_loss": 2.5,
             "cache_elems_per_token": 1024, "gflops_per_step": 1.5},
            {"name": "b, no MTP", "ms_per_step": 7.0, "gflops_per_step": 1.0}]
    assert [c[0] for c in viz._columns(rows[:1])].count("gflops_per_step") == 1
    assert "gflops_per_step" not in [c[0] for c in viz._columns([{k: v for k, v in rows[0].items()
                                                                             if k != "gflops_per_step"}])]
    fig = viz.draw_comparison_table(rows, None, sort_by="val_loss")
    table = fig.axes[0].tables[0]
    texts = [[table[(i, j)].get_text().get_text() for j in range(7)] for i in range(3)]
    assert texts[0][4] == "GFLOP/step" and texts[1][0] == "a" and texts[2][0] == "b, no MTP"
    assert texts[2][1] == "—" and texts[2][4] == "1.00"
