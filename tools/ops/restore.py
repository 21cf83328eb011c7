"""Restore a backup (python -m tools.ops.backup) into a new data dir, then check it.

    python -m tools.ops.restore SRC --data-dir DIR [--secret-key FILE] [--no-check]

Verifies every file of SRC against its manifest (size + sha256) before copying; DIR must not exist or be an
empty folder. Then (unless --no-check) starts the engine on DIR — documents that were 处理中 at backup time
are re-ingested from their originals, the BM25 index is rebuilt — and runs the consistency audit.
A backup never holds the key that seals secrets (data dir's secret.key): pass it with --secret-key (or run with
$KBQA_SECRET_KEY), or enter the listed secrets again in 配置 after the restore.
Exit status: 0 restored and the audit is clean, 1 refused or problems remain.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tools.ops.audit import render


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.ops.restore", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="backup folder (holds manifest.json)")
    ap.add_argument("--data-dir", required=True, help="new data dir to restore into")
    ap.add_argument("--secret-key", default=None, help="the source data dir's secret.key (opens sealed settings)")
    ap.add_argument("--no-check", action="store_true", help="copy only; skip the engine start and the audit")
    args = ap.parse_args(argv)

    # after the arguments: the backup module and the engine load the stores and the models (seconds)
    from pipeline.ops.backup import BackupError, restore

    target = Path(args.data_dir)
    try:
        manifest = restore(Path(args.src), target, Path(args.secret_key) if args.secret_key else None)
    except BackupError as exc:
        print(f"恢复被拒绝：{exc.msg}", file=sys.stderr)
        return 1
    c = manifest["counts"]
    print(f"已恢复到 {target}：文档 {c['docs']} · 块 {c['chunks']} · 向量 {c['vectors']}（备份于 {manifest['created_at']}）")
    if manifest["secrets_to_reenter"]:
        print("备份不含密钥文件 secret.key，以下设置需要在 配置 中重新填写（或用 --secret-key 指定原数据目录的 "
              f"secret.key 重新恢复）：{', '.join(manifest['secrets_to_reenter'])}")
    if args.no_check:
        return 0
    from pipeline.engine import Engine

    engine = Engine(target)
    try:
        engine.wait_idle(3600)  # documents caught mid-ingest are re-ingested from their originals
        report = engine.audit()
    finally:
        engine.close()
    print(render(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
