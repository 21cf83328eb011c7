"""Parse cost of the PDF table search (issue 16): seconds per page with and without pdfplumber's tables.

    python -m tools.bench.bench_pdf_tables [--docs ../shared/docs] [--rounds 3]

Real PDFs from the shared documents (ruled tables, a drawing-heavy page without a table, a plain text page); each
parsed alternately with the table search off and on (`MIN_RULE_PATHS` = how many path objects a page must draw
before its tables are looked for), best of `rounds`.
"""
from __future__ import annotations

import time
from pathlib import Path

import pipeline.ingestion.parsing.pdf_tables as pdf_tables
from pipeline.ingestion.parsing.pdf import parse_pdf
from tools.eval.cli import command_parser

REPO = Path(__file__).resolve().parents[2]
FILES = ["mineru/zh_union_rules_table_1p.pdf", "mineru/zh_ccs_ship_rules_table_1p.pdf",
         "mineru/zh_broker_research_report_tables_4p.pdf", "rapidocrpdf/direct_extract.pdf",
         "mineru/zh_chem_symbols_kangxi_radicals_1p.pdf"]


def main(argv=None) -> int:
    ap = command_parser("tools.bench.bench_pdf_tables", __doc__)
    ap.add_argument("--docs", type=Path, default=REPO.parent / "shared" / "docs")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    shipped = pdf_tables.MIN_RULE_PATHS
    try:
        for name in FILES:
            best = {"off": float("inf"), "on": float("inf")}
            pages = []
            for _ in range(args.rounds):
                for mode in ("off", "on"):
                    pdf_tables.MIN_RULE_PATHS = 10**9 if mode == "off" else shipped
                    t0 = time.perf_counter()
                    pages, _ = parse_pdf(args.docs / name, ocr_enabled=False)
                    best[mode] = min(best[mode], time.perf_counter() - t0)
            n = max(len(pages), 1)
            print(f"{name}: {n} pages, without tables {best['off'] / n:.3f} s/page, with {best['on'] / n:.3f} s/page")
    finally:
        pdf_tables.MIN_RULE_PATHS = shipped
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
