"""The instructor's class report (coursetools/report.py) from a grading record: its counts, its files, and that
nothing hidden reaches it. The record a real ``course grade`` run writes is checked in tests/test_grading_tamper.py.
"""

from __future__ import annotations

import csv
import json
import re

import pytest

from coursetools.report import RECORD_NAME, load_record, summarize, write_report

EXERCISES = (("03.softmax_stable", 3), ("03.simple_attention", 3))


def _sub(student, assignment, results, notes=""):
    """``results``: per exercise ``(status, mistake or None, message)``."""
    exercises = []
    for (ex_id, pts), (status, mistake, message) in zip(EXERCISES, results):
        exercises.append({"id": ex_id, "points": float(pts if status == "passed" else 0), "max_points": float(pts),
                          "status": status, "mistake": mistake, "hint": f"hint of {mistake}" if mistake else None,
                          "section": "lesson 03 §3 Softmax, and computing it safely" if mistake else None,
                          "message": message})
    score = sum(e["points"] for e in exercises)
    return {"student": student, "assignment": assignment, "score": score, "max_score": 6.0, "notes": notes,
            "exercises": exercises}


PASS = ("passed", None, "")
STUB = ("not_attempted", None, "not attempted")


def _record():
    subs = [
        _sub("ann", "03_self_attention", [PASS, PASS]),
        _sub("bob", "03_self_attention", [("failed", "no_max_shift", "overflow at 1000.5"), PASS]),
        _sub("cid", "03_self_attention", [("failed", "no_max_shift", "overflow at 88.0"), STUB]),
        _sub("dee", "03_self_attention", [("failed", None, "rows sum to 1.25, not 1"), ("failed", None,
                                                                                        "rows sum to 3, not 1")]),
        _sub("eve", "03_self_attention", [("error", None, "no verdict")] * 2, notes="scored 0: the submission modified the grading code "
                                                              "(grader/core.py changed while the checker ran eve)"),
        _sub("bob", "04_other", [("failed", "no_max_shift", "overflow"), PASS]),
    ]
    return {"submissions": subs, "tampering": ["TAMPERED eve/03_self_attention: the submission modified ..."]}


def test_counts_rates_and_ranking():
    s = summarize(_record())
    a = s["assignments"]["03_self_attention"]
    soft, simple = a["exercises"]
    assert (soft["attempted"], soft["passed"], simple["attempted"], simple["passed"]) == (5, 1, 4, 2)
    assert soft["attempt_rate"] == 5 / 5 and simple["pass_rate"] == 2 / 5
    assert soft["score_distribution"] == {"0": 4, "3": 1}
    assert [(m["mistake"], m["students"]) for m in a["named_mistakes"]] == [("no_max_shift", ["bob", "cid"])]
    assert a["named_mistakes"][0]["hint"] == "hint of no_max_shift"
    assert a["named_mistakes"][0]["section"] == "lesson 03 §3 Softmax, and computing it safely"
    # the same property with other numbers is one group
    assert [(g["exercise"], g["property"], g["students"]) for g in a["unnamed_failures"]] == [
        ("03.simple_attention", "rows sum to #, not #", ["dee"]), ("03.softmax_stable", "rows sum to #, not #", ["dee"])]
    heat = {r["student"]: r["cells"] for r in a["heat_map"]}
    assert heat["ann"] == {"03.softmax_stable": "passed", "03.simple_attention": "passed"}
    assert heat["cid"] == {"03.softmax_stable": "failed, named", "03.simple_attention": "not attempted"}
    assert heat["dee"]["03.softmax_stable"] == "failed"
    assert heat["eve"]["03.softmax_stable"] == "error or limit"  # no verdict: it changed the grading code
    follow = {(f["student"], f["assignment"]): f["why"] for f in s["follow_up"]}
    assert set(follow) == {("cid", "03_self_attention"), ("dee", "03_self_attention"), ("eve", "03_self_attention"),
                           ("bob", "several")}, follow
    assert "no_max_shift" in follow[("bob", "several")]
    assert [(x["student"], x["limits"]) for x in s["limits"]] == [("eve", ["modified the grading code"])]
    assert set(s["assignments"]) == {"03_self_attention", "04_other"}


def test_files_are_written_self_contained_and_hide_nothing_more_than_the_feedback(tmp_path):
    (tmp_path / RECORD_NAME).write_text(json.dumps(_record()), encoding="utf-8")
    paths = write_report(tmp_path)
    page = paths["html"].read_text(encoding="utf-8")
    assert "<script src" not in page and not re.search(r"""(href|src)=["']?https?:""", page)  # offline
    assert "no_max_shift" in page and "Across assignments" in page and "TAMPERED eve" in page
    assert "lesson 03 §3 Softmax, and computing it safely" in page
    # the plots: three per assignment, inline vector SVG (no raster image, nothing linked), or a reason each
    assert "plot not drawn" not in page
    assert page.count("<figure class='plot'") == 6 and page.count("<svg") == 6
    assert "<image" not in page and "xlink:href=\"http" not in page and "@import" not in page
    for hidden in ("def check_", "BEGIN SOLUTION", "BEGIN HIDDEN", "grader/checks", "B03."):
        assert hidden not in page
    assert json.loads(paths["json"].read_text())["assignments"]["03_self_attention"]["students"] == 5
    with paths["mistakes"].open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert rows[0]["mistake"] == "no_max_shift" and rows[0]["students"] == "2"
    assert rows[0]["section"] == "lesson 03 §3 Softmax, and computing it safely"


def test_a_hostile_name_stays_text(tmp_path):
    """A student id or message with markup or matplotlib's math marks is escaped in the page and the plots."""
    rec = _record()
    rec["submissions"][1]["student"] = "<script>alert(1)</script>$\\frac{a}{$"
    rec["submissions"][1]["exercises"][0]["message"] = "<img src=x onerror=alert(1)>"
    (tmp_path / RECORD_NAME).write_text(json.dumps(rec), encoding="utf-8")
    page = write_report(tmp_path)["html"].read_text(encoding="utf-8")
    assert "plot not drawn" not in page and "<script>alert" not in page and "<img src=x" not in page
    assert page.count("<script") == 1  # the page's own sort script


def test_a_folder_without_a_record_says_what_to_give(tmp_path, capsys):
    from coursetools.cli import main

    with pytest.raises(FileNotFoundError, match="course grade"):
        load_record(tmp_path)
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "course grade" in err[0], err
