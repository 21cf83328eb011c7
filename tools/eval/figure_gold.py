"""The figure check (pipeline/generation/answer_type.lacks_answer) read against the gold answers themselves: for
every question of the dev sets that asks for a number or a time and has a gold answer, would the check call that
answer lacking? Every such flag is a false one — a right answer the app would mark weak. No pipeline run, seconds.

    python -m tools.eval.figure_gold [--show 10] [--sets xquad_zh cmrc_trial ...]

DuReader's questions carry no short gold answers (its answers are whole passages): it has nothing to check.
docs/retrieval-eval.md ("The unit asked…") reports the numbers.
"""
from __future__ import annotations

from collections.abc import Iterable

from pipeline.generation.answer_type import MUST_OFFER, expected_kind, lacks_answer
from tools.eval.cli import command_parser
from tools.eval.devsets import DEV_SETS, Question, load_corpus


def false_flags(questions: Iterable[Question]) -> tuple[int, list[tuple[str, str]]]:
    """(questions the check reads, [(question, gold answer) it calls lacking])."""
    read, flagged = 0, []
    for q in questions:
        kind = expected_kind(q.text)
        if not q.answers or kind not in MUST_OFFER:
            continue
        read += 1
        if lacks_answer(kind, [q.answers[0]], q.text):
            flagged.append((q.text, q.answers[0]))
    return read, flagged


def main(argv: list[str] | None = None) -> None:
    ap = command_parser("tools.eval.figure_gold", __doc__)
    ap.add_argument("--sets", nargs="*", default=list(DEV_SETS))
    ap.add_argument("--show", type=int, default=10, help="flagged gold answers shown per set")
    args = ap.parse_args(argv)
    for name in args.sets:
        read, flagged = false_flags(load_corpus(DEV_SETS[name]).questions)
        print(f"{name}: figure questions with a gold answer {read}, gold answer called lacking {len(flagged)}")
        for question, gold in flagged[:args.show]:
            print(f"    {question} | {gold}")


if __name__ == "__main__":
    main()
