"""``LLMCOURSE_MAX_TORCH_THREADS`` caps every ``*torch_threads`` value of the profile (the browser tests use 1)."""

from __future__ import annotations

import pytest

from llmcourse.runtime import MAX_THREADS_ENV, profile


def _threads(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if k.endswith("torch_threads")}


def test_the_cap_lowers_every_thread_count_and_never_raises_one(monkeypatch):
    monkeypatch.delenv(MAX_THREADS_ENV, raising=False)
    plain = profile("17", name="laptop")      # torch_threads and lab_torch_threads
    assert len(_threads(plain)) == 2 and max(_threads(plain).values()) >= 2
    monkeypatch.setenv(MAX_THREADS_ENV, "1")
    assert set(_threads(profile("17", name="laptop")).values()) == {1}
    monkeypatch.setenv(MAX_THREADS_ENV, "64")
    assert _threads(profile("17", name="laptop")) == _threads(plain)
    assert {k: v for k, v in profile("17", name="laptop").items() if "threads" not in k} == \
        {k: v for k, v in plain.items() if "threads" not in k}


@pytest.mark.parametrize("bad", ["0", "-1", "two", "1.5"])
def test_a_bad_cap_is_refused_with_its_name(monkeypatch, bad):
    monkeypatch.setenv(MAX_THREADS_ENV, bad)
    with pytest.raises(ValueError, match=MAX_THREADS_ENV):
        profile("00", name="ci")
