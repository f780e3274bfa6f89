"""docs/BENCHMARKS.md is what bench/write_doc.py makes of the runs' records and the prose."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import results  # noqa: E402
import write_doc  # noqa: E402


def test_the_page_is_what_the_records_give():
    assert write_doc.PAGE.read_text(encoding="utf-8") == write_doc.build(), (
        "docs/BENCHMARKS.md is stale or edited by hand: edit bench/doc/ or bench/results/, then `make benchmarks-doc`"
    )


def _write(folder: Path, name: str, records: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _doc(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "00-head.md").write_text("# Page\n")
    (folder / "01-section.md").write_text(text)
    return folder


def test_a_newer_run_replaces_its_configuration_and_keeps_the_others(tmp_path):
    _write(
        tmp_path / "results",
        "speed",
        [
            {
                "date": "2026-01-01",
                "command": "run a",
                "rows": [{"config": "a", "tok/s": 10}, {"config": "b", "tok/s": 20}],
            },
            {"date": "2026-02-01", "command": "run a again", "rows": [{"config": "a", "tok/s": 12.5}]},
        ],
    )
    page = write_doc.build(_doc(tmp_path / "doc", "## Speed\n\n{{table speed}}\n"), tmp_path / "results")
    table = [line for line in page.splitlines() if line.startswith("| ")]
    assert table == ["| config | tok/s |", "| b | 20 |", "| a | 12.5 |"]
    assert "run a again" in page and "# 2026-02-01: a" in page and "# 2026-01-01: b" in page
    assert "- [Speed](#speed)" in page


def test_replace_table_starts_the_table_over(tmp_path):
    _write(
        tmp_path / "results",
        "speed",
        [
            {"date": "2026-01-01", "command": "old", "rows": [{"config": "a", "x": 1}, {"config": "b", "x": 2}]},
            {"date": "2026-02-01", "command": "new", "replace_table": True, "rows": [{"config": "c", "x": 3}]},
        ],
    )
    page = write_doc.build(_doc(tmp_path / "doc", "{{table speed}}\n"), tmp_path / "results")
    assert "| c | 3 |" in page and "| a |" not in page and "old" not in page


def test_nothing_measured_is_dropped_and_nothing_is_invented(tmp_path):
    _write(tmp_path / "results", "speed", [{"date": "2026-01-01", "command": "c", "rows": [{"k": 1}]}])
    with pytest.raises(write_doc.DocError, match="speed/main"):
        write_doc.build(_doc(tmp_path / "doc", "no table here\n"), tmp_path / "results")
    with pytest.raises(write_doc.DocError, match="no record"):
        write_doc.build(_doc(tmp_path / "doc2", "{{table other}}\n"), tmp_path / "results")


def test_a_malformed_record_is_an_error_that_names_its_line(tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "speed.jsonl").write_text('{"date": "2026-01-01", "command": "c", "rows": [{"k": 1}]}\n{not json\n')
    with pytest.raises(ValueError, match=r"speed.jsonl:2"):
        results.read_records(folder)
    (folder / "speed.jsonl").write_text('{"date": "2026-01-01", "command": "c", "rows": []}\n')
    with pytest.raises(ValueError, match="non-empty rows"):
        results.read_records(folder)


def test_record_run_appends_a_line_the_page_can_use(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bench/speed.py", "--episodes", "4", "--record"])
    results.record_run("speed", [{"config": "a", "tok/s": 1.5}], results_dir=tmp_path, results={"raw": 1})
    results.record_run("speed", [{"config": "a", "tok/s": 2.5}], results_dir=tmp_path)
    recs = results.read_records(tmp_path)
    assert [r["rows"][0]["tok/s"] for r in recs] == [1.5, 2.5]
    assert recs[0]["command"].endswith("bench/speed.py --episodes 4") and "--record" not in recs[0]["command"]
    assert recs[0]["results"] == {"raw": 1}
