"""HTML report of a run (or a comparison of two): metrics with CIs, triage, pass@k curves, plots
as SVG files, and a trajectory viewer whose episode data is paged from small files.

    from harnessrl.report import build_report, serve
    index = build_report([Path("runs/eval")])      # runs/eval/report/index.html
    server, url = serve(index.parent)              # http://127.0.0.1:PORT/index.html

See docs/report.md.
"""

from harnessrl.report.build import ReportError, build_report, change_sentence, report_json
from harnessrl.report.episodes import MAX_FIELD_CHARS, PAGE_SIZE, read_data_file
from harnessrl.report.serve import serve

__all__ = [
    "ReportError",
    "build_report",
    "change_sentence",
    "report_json",
    "read_data_file",
    "serve",
    "PAGE_SIZE",
    "MAX_FIELD_CHARS",
]
