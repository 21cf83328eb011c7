"""Back up the knowledge base while the app runs (consistent across SQLite, Chroma and the originals).

    python -m tools.ops.backup DEST [--url URL [--user U]] | [--data-dir DIR]

By default the running app makes the backup (POST /api/kb/backup; DEST is a path on the app's machine): it
freezes its writes for the copy, questions keep being answered. With --data-dir, a data dir no app is using
is backed up directly. DEST must not exist (or be an empty folder). Writes DEST/manifest.json with counts and
sha256 checksums; restore with `python -m tools.ops.restore DEST --data-dir NEW_DIR`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tools.ops.app_client import AppError, add_app_args, call


def summary(m: dict) -> str:
    c = m["counts"]
    return (f"备份完成：文档 {c['docs']}（就绪 {c['ready_docs']}，处理中 {c['processing_docs']}）· 块 {c['chunks']}"
            f" · 向量 {c['vectors']} · 原始文件 {c['files']} · 共 {len(m['files'])} 个文件；写入暂停 {m['frozen_ms']} ms，"
            f"总用时 {m['elapsed_ms']} ms" + (f"\n⚠ 缺少原始文件：{', '.join(m['missing_originals'])}"
                                          if m["missing_originals"] else ""))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.ops.backup", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dest", help="backup folder to create")
    ap.add_argument("--data-dir", default=None, help="back up this data dir directly (no app running on it)")
    ap.add_argument("--json", action="store_true", help="print the manifest")
    add_app_args(ap)
    args = ap.parse_args(argv)
    dest = Path(args.dest).absolute()
    try:
        if args.data_dir:
            # the offline form opens the stores (Chroma, the database stack): the app's form needs only HTTP
            from pipeline.ops.offline_audit import backup_data_dir

            manifest = backup_data_dir(Path(args.data_dir), dest)
        else:
            manifest = call(args, "POST", "/api/kb/backup", json={"dest": str(dest)})
    except (AppError, RuntimeError, ValueError, FileNotFoundError) as exc:
        print(f"备份失败：{getattr(exc, 'msg', None) or exc}", file=sys.stderr)
        return 1
    print(json.dumps(manifest, ensure_ascii=False, indent=2) if args.json else summary(manifest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
