"""`course bench all` (what `make bench` runs) writes one report ending with the summary line (tiny sizes; format only)."""

from __future__ import annotations

import re

from coursetools.bench import report
from coursetools.cli import main

SUMMARY = re.compile(r"^bench: train \d+\.\d{2}, decode \d+\.\d/\d+\.\d{2}, capstone \d+\.\d{2}$")


def test_bench_all_writes_one_report(tmp_path, capsys):
    code = main(["bench", "all", "--smoke", "--out", str(tmp_path)])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    assert SUMMARY.match(out[-1]), out[-1]
    text = (tmp_path / "report.md").read_text()
    assert text.strip().splitlines()[-1] == out[-1]
    for part in report.PARTS:
        assert f"| {part} | `course bench {part}" in text
        assert (tmp_path / f"{part}.json").exists()
    assert "![decode](decode.png)" in text and "![capstone](capstone.png)" in text
    for line in ("train: min ratio vs transformers:", "decode: min cached speedup:", "capstone: ratio vs transformers:"):
        assert line in text


def test_summary_line_format():
    line = report.summary_line({"geomean_ratio": 1.034}, {"min_speedup": 11.26, "min_ratio": 0.994}, {"ratio": 1.2})
    assert line == "bench: train 1.03, decode 11.3/0.99, capstone 1.20" and SUMMARY.match(line)


def test_the_full_run_keeps_cached_medians_and_one_uncached_run():
    import argparse

    p = argparse.ArgumentParser()
    report.add_arguments(p)
    args = p.parse_args([])
    assert report.part_arguments("train", args) == [] and report.part_arguments("capstone", args) == []
    assert report.part_arguments("decode", args) == ["--repeats", "3", "--uncached-repeats", "1",
                                                     "--uncached-samples", "5"]
