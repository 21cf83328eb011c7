"""OCR speed on the 2-page scanned book fixture: `python -m tools.bench.bench_ocr [pdf ...]`.

Prints render and OCR wall seconds per page (model load is reported separately) and the OCR CPU seconds
(all threads), which do not depend on what else the machine is running."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

from tools.eval.cli import command_parser

DEFAULT_PDF = Path(__file__).resolve().parents[2] / ".." / "shared" / "docs" / "mineru" / "zh_scanned_book_2p.pdf"


def bench(pdf_path: Path) -> dict:
    # the OCR stack (onnxruntime, the OCR models' runtime) loads in seconds: not for --help
    import pypdfium2 as pdfium

    from pipeline.ingestion.parsing import ocr

    t0 = time.perf_counter()
    engine = ocr.get_engine()
    # warm-up on a tiny blank image so that model loading is not charged to page 1
    engine(np.full((64, 256, 3), 255, dtype=np.uint8))
    load_s = time.perf_counter() - t0

    pdf = pdfium.PdfDocument(str(pdf_path))
    rows = []
    for i in range(len(pdf)):
        page = pdf[i]
        t1 = time.perf_counter()
        image = ocr.render_page(page)
        t2 = time.perf_counter()
        c2 = time.process_time()
        boxes = ocr.ocr_page_image(image)
        t3 = time.perf_counter()
        cpu = time.process_time() - c2
        text = ocr.layout_text(boxes)
        rows.append({"page": i + 1, "render_s": t2 - t1, "ocr_s": t3 - t2, "cpu_s": cpu, "size": image.shape[:2],
                     "lines": len(boxes), "chars": len(text)})
        page.close()
    pdf.close()
    per_page = sum(r["render_s"] + r["ocr_s"] for r in rows) / max(len(rows), 1)
    return {"pdf": pdf_path.name, "load_s": load_s, "rows": rows, "per_page_s": per_page,
            "threads": ocr.ocr_threads(), "cpus": os.cpu_count()}


def main(argv: list[str] | None = None) -> int:
    ap = command_parser("tools.bench.bench_ocr", __doc__)
    ap.add_argument("pdfs", nargs="*", type=Path, help=f"PDF files (default: {DEFAULT_PDF.name})")
    paths = ap.parse_args(argv).pdfs or [DEFAULT_PDF]
    for p in paths:
        r = bench(p)
        print(f"{r['pdf']}: model load {r['load_s']:.2f} s, onnxruntime threads {r['threads']} (cpus {r['cpus']})")
        for row in r["rows"]:
            h, w = row["size"]
            print(f"  page {row['page']}: render {row['render_s']:.2f} s ({w}x{h} px), OCR {row['ocr_s']:.2f} s, "
                  f"{row['lines']} boxes, {row['chars']} chars")
        cpu = sum(row["cpu_s"] for row in r["rows"]) / max(len(r["rows"]), 1)
        print(f"  => {r['per_page_s']:.2f} s per page wall (render + OCR), {cpu:.2f} CPU-s per page")
    return 0


if __name__ == "__main__":
    sys.exit(main())
