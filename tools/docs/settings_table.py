"""Print the settings reference table of README.md from the Field declarations in pipeline/settings.py.

    python -m tools.docs.settings_table            # print the table
    python -m tools.docs.settings_table --write    # replace the table between the markers in README.md

tests/test_settings.py checks that README.md holds exactly this table, so the README cannot drift.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.settings import GROUPS, Settings, field_meta, range_text

README = Path(__file__).resolve().parents[2] / "README.md"
BEGIN, END = "<!-- settings-table:begin -->", "<!-- settings-table:end -->"
EFFECT = {"immediate": "立即", "reload": "重载引擎", "rebuild": "新文档立即；已有文档需全量重建"}


def table() -> str:
    rows = ["| 分组 | 字段 | 名称 | 默认 | 范围 | 生效 | 说明 |", "|---|---|---|---|---|---|---|"]
    for group, names in GROUPS.items():
        for name in names:
            info, meta = Settings.model_fields[name], field_meta(name)
            default = info.default if info.default != "" else "（空）"
            rows.append(f"| {group} | `{name}` | {meta['label']} | {default} | {range_text(name) or '–'} | "
                        f"{EFFECT[meta['effect']]} | {info.description} |")
    return "\n".join(rows)


def readme_with_table(text: str) -> str:
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.docs.settings_table", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", action="store_true", help="update README.md in place")
    args = p.parse_args(argv)
    if args.write:
        README.write_text(readme_with_table(README.read_text(encoding="utf-8")), encoding="utf-8")
    else:
        print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
