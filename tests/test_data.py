"""The data layer: registry vs mirror, resolution order, clear errors, the offline GPT-2 tokenizer."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from llmcourse.data import DATASETS, DataNotFoundError, data_path, gpt2_encoding, load_text
from llmcourse.data.resolve import sha256_of

MIRROR = os.environ.get("LLMCOURSE_DATA_MIRROR")
needs_mirror = pytest.mark.skipif(not MIRROR, reason="LLMCOURSE_DATA_MIRROR is not set (CI sets ../shared/data)")


@needs_mirror
def test_registry_matches_the_mirror_files():
    for ds in DATASETS.values():
        for f in ds.files:
            p = Path(MIRROR) / f.path
            assert p.stat().st_size == f.size, f.path
            assert hashlib.sha256(p.read_bytes()).hexdigest() == f.sha256, f.path
            assert f.url.startswith("https://")


@needs_mirror
def test_registry_agrees_with_the_mirror_sha256sums():
    sums = {}
    for line in (Path(MIRROR) / "SHA256SUMS").read_text().splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            sums[name.lstrip("*").removeprefix("./")] = digest
    for ds in DATASETS.values():
        for f in ds.files:
            assert sums.get(f.path) == f.sha256, f.path


@needs_mirror
def test_dataset_facts():
    text = load_text("tinyshakespeare")
    assert len(text) == 1_115_394 and text.count("\n") == 40_000 and len(set(text)) == 65
    assert hashlib.md5(text.encode()).hexdigest() == "6fb458f1232090904fb40fe944165e91"
    verdict = load_text("the-verdict")
    assert len(verdict) == 20_479
    for name in ("amazon_cells_labelled.txt", "imdb_labelled.txt", "yelp_labelled.txt"):
        lines = load_text("uci-sentiment", f"sentiment/{name}").rstrip("\n").split("\n")  # not splitlines(): U+0085 etc.
        labels = [ln.rsplit("\t", 1)[1] for ln in lines]
        assert len(lines) == 1000 and labels.count("1") == 500 and labels.count("0") == 500
    assert len(load_text("tatoeba-eng-hin").splitlines()) == 3117


def test_missing_dataset_error_names_dataset_url_and_mirror_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMCOURSE_DATA_MIRROR", str(tmp_path / "empty-mirror"))
    monkeypatch.setenv("LLMCOURSE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("LLMCOURSE_OFFLINE", "1")
    with pytest.raises(DataNotFoundError) as err:
        data_path("tinyshakespeare")
    msg = str(err.value)
    assert "tinyshakespeare" in msg and DATASETS["tinyshakespeare"].files[0].url in msg
    assert "LLMCOURSE_DATA_MIRROR" in msg


def test_unknown_dataset_is_a_clear_keyerror():
    with pytest.raises(KeyError, match="unknown dataset"):
        data_path("no-such-dataset")


@needs_mirror
def test_resolution_order_and_checksum_verification(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("LLMCOURSE_CACHE", str(cache))
    # mirror only -> mirror
    assert data_path("the-verdict").parent == Path(MIRROR)
    # a valid copy in the user cache wins over the mirror
    dest = cache / "data" / "the-verdict.txt"
    dest.parent.mkdir(parents=True)
    shutil.copyfile(Path(MIRROR) / "the-verdict.txt", dest)
    assert data_path("the-verdict") == dest
    # a corrupted cache copy is ignored (with a warning) and the mirror is used
    dest.write_text("corrupted")
    with pytest.warns(UserWarning, match="does not match"):
        assert data_path("the-verdict").parent == Path(MIRROR)


@needs_mirror
def test_gpt2_encoding_offline_fixtures():
    enc = gpt2_encoding()
    assert enc.n_vocab == 50257 and enc.eot_token == 50256
    assert enc.encode("Hello, world") == [15496, 11, 995]
    text = "Hello, world! Attention is all you need.<|endoftext|>"
    assert enc.encode(text, allowed_special={"<|endoftext|>"}) == [15496, 11, 995, 0, 47406, 318, 477, 345, 761, 13, 50256]
    with pytest.raises(ValueError):
        enc.encode("<|endoftext|>")
    ids = enc.encode(load_text("the-verdict"))
    assert len(ids) == 5145 and ids[:10] == [40, 367, 2885, 1464, 1807, 3619, 402, 271, 10899, 2138]


@needs_mirror
def test_gpt2_encoding_identical_to_tiktoken_get_encoding(tmp_path, monkeypatch):
    """Route (b): tiktoken's own loader from a writable copy of the mirror's cache gives identical ids."""
    import tiktoken
    import tiktoken.registry

    from llmcourse.data import tiktoken_cache_dir

    cache = tiktoken_cache_dir(tmp_path / "tiktoken_cache")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})  # force a fresh load through the cache
    reference = tiktoken.get_encoding("gpt2")
    ours = gpt2_encoding()
    assert reference._mergeable_ranks == ours._mergeable_ranks
    assert reference._special_tokens == ours._special_tokens
    for text in [load_text("the-verdict"), load_text("tinyshakespeare")[:200_000], "नमस्ते 🙂 naïve café\n\t x"]:
        assert reference.encode(text) == ours.encode(text)
    assert sha256_of(cache / "0ea1e91bbb3a60f729a8dc8f777fd2fc07cd8df4") == DATASETS["gpt2-bpe"].files[0].sha256


@pytest.fixture()
def local_server(tmp_path):
    """A throwaway HTTP server on 127.0.0.1 serving ``tmp_path/www`` (no outside network)."""
    import functools
    import http.server
    import threading

    www = tmp_path / "www"
    www.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(www))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield www, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_download_verifies_checksum_and_extracts_zip_members(tmp_path, monkeypatch, local_server):
    import zipfile

    from llmcourse.data import registry

    www, base = local_server
    payload = b"hello, offline world\n" * 100
    (www / "plain.txt").write_bytes(payload)
    with zipfile.ZipFile(www / "bundle.zip", "w") as zf:
        zf.writestr("inner/plain.txt", payload)
    digest = hashlib.sha256(payload).hexdigest()
    test_sets = {
        "plain": registry.Dataset("plain", "test", "test", (registry.DataFile("plain.txt", digest, len(payload),
                                                                              f"{base}/plain.txt"),)),
        "zipped": registry.Dataset("zipped", "test", "test", (registry.DataFile(
            "z/plain.txt", digest, len(payload), f"{base}/bundle.zip", "inner/plain.txt"),)),
        "corrupt": registry.Dataset("corrupt", "test", "test", (registry.DataFile(
            "c/plain.txt", "0" * 64, len(payload), f"{base}/plain.txt"),)),
    }
    monkeypatch.setattr(registry, "DATASETS", {**registry.DATASETS, **test_sets})
    monkeypatch.setenv("LLMCOURSE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LLMCOURSE_OFFLINE", raising=False)
    for name, rel in [("plain", "plain.txt"), ("zipped", "z/plain.txt")]:
        path = data_path(name)
        assert path == tmp_path / "cache" / "data" / rel and path.read_bytes() == payload
    with pytest.raises(DataNotFoundError, match="sha256"):
        data_path("corrupt")
    assert not (tmp_path / "cache" / "data" / "c" / "plain.txt").exists(), "a corrupt download must not be kept"
