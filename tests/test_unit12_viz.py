"""Unit 12 widgets: the animation's data come from a real cache, the calculator's numbers from the formula,
the speed measurement compares equal tokens; every widget has a static fallback and a live version."""

from __future__ import annotations

import pytest
import torch

from llmcourse.models.llama3 import Llama3Config
from llmcourse.models.llama3_cached import CachedLlama3Model
from llmcourse.viz import kv_cache as V


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return CachedLlama3Model(Llama3Config.preset("llama3-tiny")).eval()


def test_animation_frames(model):
    frames = V.cache_animation_frames(model, torch.randint(0, 65, (1, 5)), 4)
    assert [f["cache_len"] for f in frames] == [[5] * 4, [6] * 4, [7] * 4, [8] * 4]
    assert frames[0]["weights"].shape == (5, 5) and frames[2]["weights"].shape == (1, 7)
    assert torch.allclose(frames[0]["weights"].sum(-1), torch.ones(5))
    assert frames[0]["weights"].triu(1).abs().max() == 0          # causal during prefill
    assert V.show_cache_animation(frames, static=True)._repr_png_()[:4] == b"\x89PNG"
    assert type(V.show_cache_animation(frames, static=False)).__name__ == "VBox"


def test_memory_numbers():
    m = V.cache_memory("Llama-3.2-1B", 131072)
    assert m["cache"] == 4 * 2**30 and m["n_kv_heads"] == 8
    assert abs(m["weights"] / 1e9 - 2.47) < 0.01
    assert V.cache_memory("Llama-3.2-1B", 1, attention="MHA")["per_token"] == 128 * 1024
    assert V.cache_memory("Llama-3.2-1B", 1, attention="MQA")["per_token"] == 4 * 1024
    assert V.cache_memory("GPT-2 small", 1024, dtype="fp32")["cache"] == 72 * 2**20
    assert V.show_memory_calculator(static=True)._repr_png_()[:4] == b"\x89PNG"
    assert type(V.show_memory_calculator(static=False)).__name__ == "VBox"


def test_speed_measurement(model):
    r = V.measure_decode_speed(model, model, torch.randint(0, 65, (1, 4)), 6)
    assert r["same_tokens"] and len(r["cached_ms"]) == len(r["uncached_ms"]) == 6 and r["length"][0] == 5
    assert V.show_speed_plot(r, static=True)._repr_png_()[:4] == b"\x89PNG"
    assert type(V.show_speed_plot(r, static=False)).__name__ == "VBox"
