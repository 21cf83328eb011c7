"""Real spreadsheet / Markdown files written at test time (openpyxl, csv) for the structure tests."""
from __future__ import annotations

import re
import shutil
import zipfile
from pathlib import Path

README_MD = """# 星河网关 用户手册

星河网关是一个轻量的 API 网关。本手册介绍安装、配置与常见问题。

## 安装

### 系统要求

运行星河网关需要 64 位 Linux，内存不少于 2 GB。

| 组件 | 最低版本 | 说明 |
|:---|:---:|---|
{rows}

### 安装步骤

下载安装包后执行 install.sh，脚本会创建 xinghe 用户并注册系统服务。安装完成后访问 8080 端口的管理页面。

## 配置

### 限流

限流规则写在 limits.yaml 中，每条规则包含路径、每秒请求数和突发容量。修改后执行 reload 即可生效，无需重启。

```
# 这一行在代码块里，不是标题
| 也 | 不是 | 表格 |
```

## 常见问题

端口被占用时，修改 gateway.conf 中的 listen 项。
"""

COMPONENT_ROWS = [f"| 组件{i:02d} | {i}.{i % 7}.0 | 第{i:02d}号组件负责请求链路中的一个环节，升级前请阅读发布说明 |"
                  for i in range(40)]


def write_readme(path: Path) -> Path:
    path.write_text(README_MD.replace("{rows}", "\n".join(COMPONENT_ROWS)), encoding="utf-8")
    return path


SALES_HEADER = ["订单号", "客户", "产品", "单价", "数量", "金额"]


def sales_rows(n: int = 60) -> list[list]:
    products = ["路由器", "交换机", "光猫", "网卡", "机柜"]
    return [[f"SO-{1000 + i}", f"客户{i % 9}公司", products[i % 5], 100 + i, i % 4 + 1, None] for i in range(n)]


def write_workbook(path: Path, n: int = 60) -> dict[str, object]:
    """销售 (header + n rows, 金额 a formula with a cached value), 空表 (empty), 说明 (two rows, a formula left
    uncalculated). Returns the expected cached values by cell."""
    import openpyxl

    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "销售"
    ws.append(SALES_HEADER)
    values = {}
    for r, row in enumerate(sales_rows(n), start=2):
        row[5] = f"=D{r}*E{r}"
        ws.append(row)
        values[f"F{r}"] = row[3] * row[4]
    wb.create_sheet("空表")
    notes = wb.create_sheet("说明")
    notes.append(["项目", "内容"])
    notes.append(["统计口径", "含税金额"])
    notes.append(["合计", "=SUM(销售!F2:F10)"])
    wb.save(path)
    _cache_formula_values(path, "xl/worksheets/sheet1.xml", values)
    return values


def _cache_formula_values(path: Path, member: str, values: dict[str, object]) -> None:
    """Write cached results into formula cells, as Excel does when it saves (openpyxl leaves <v></v> empty)."""
    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename == member:
                xml = data.decode("utf-8")
                for ref, v in values.items():
                    xml = re.sub(rf'(<c r="{ref}"[^>]*><f>[^<]*</f>)<v\s*/?>(?:</v>)?', rf"\g<1><v>{v}</v>", xml)
                data = xml.encode("utf-8")
            zout.writestr(info, data)
    shutil.move(tmp, path)


def write_csv(path: Path, n: int = 50, encoding: str = "gb18030", delimiter: str = ";") -> Path:
    import csv

    with open(path, "w", encoding=encoding, newline="") as f:
        w = csv.writer(f, delimiter=delimiter)
        w.writerow(["城市", "门店", "地址", "电话"])
        for i in range(n):
            w.writerow([f"城市{i % 6}", f"第{i}号门店", f"人民路{i}号；靠近地铁{i % 3}号线", f"0571-8888{i:04d}"])
    return path
