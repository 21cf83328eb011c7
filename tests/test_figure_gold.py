"""tools.eval.figure_gold counts the figure check's false flags on gold answers."""
from __future__ import annotations

from tests.shared_data import DATA, needs
from tools.eval.devsets import Question
from tools.eval.figure_gold import false_flags, main


def test_false_flags_reads_only_figure_questions_with_a_gold_answer():
    qs = [Question("鑫诺一号通信卫星在轨寿命是多少年？", {"d"}, ["15年"]),
          Question("发现的栉水母化石有多少年历史了？", {"d"}, ["5.15亿年"]),
          Question("夏季剧院运营多长时间了？", {"d"}, ["1870 年到 1939 年"]),  # dates are no length: a false flag
          Question("谁演唱了国歌？", {"d"}, ["女神卡卡"]),  # not a figure question
          Question("多少人参加了试飞？", {"d"}, [])]  # no gold answer
    read, flagged = false_flags(qs)
    assert read == 3 and flagged == [("夏季剧院运营多长时间了？", "1870 年到 1939 年")]


@needs(DATA / "xquad" / "xquad.zh.json")
def test_main_prints_a_line_per_set(capsys):
    main(["--sets", "xquad_zh", "--show", "1"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("xquad_zh: figure questions with a gold answer 265, gold answer called lacking ")
    assert len(out) == 2 and " | " in out[1]
