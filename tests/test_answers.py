import pytest

from selfplay.games.answers import BOXED, AnswerFormat, normalize


@pytest.mark.parametrize(
    "text, expected",
    [
        ("I will play the centre. \\boxed{4}", "4"),
        ("\\boxed{1} no wait \\boxed{7}", "7"),  # the last answer counts
        ("\\boxed{\\text{bet}}", "\\text{bet}"),  # nested braces are kept whole
        ("\\boxed{ [Bet] }", " [Bet] "),
        ("the answer is 4", None),
        ("\\boxed{4", None),  # unterminated
        ("", None),
    ],
)
def test_boxed_extraction(text, expected):
    assert BOXED.extract(text) == expected


def test_other_marker_formats():
    tags = AnswerFormat("<answer>", "</answer>")
    assert tags.extract("think... <answer>call</answer>") == "call"
    assert tags.wrap("fold") == "<answer>fold</answer>"
    assert tags.extract("<answer>call") is None


@pytest.mark.parametrize(
    "answer, expected",
    [
        (" [Bet] ", "bet"),
        ("\\text{Call}", "call"),
        ("\\textbf{ pile 2  take 3 }", "pile 2 take 3"),
        ("'fold'.", "fold"),
        ("(4)", "4"),
        ("Offer   2 Wood\nfor 1 gold", "offer 2 wood for 1 gold"),
    ],
)
def test_normalize_ignores_case_spacing_brackets(answer, expected):
    assert normalize(answer) == expected


def test_instruction_names_format_and_example():
    text = BOXED.instruction("4")
    assert "\\boxed{}" in text and "\\boxed{4}" in text
