"""The rule judge on its corpora (tests/judge_corpora.py): no innocent reply flagged for any
secret, every evasion of a class it claims caught; and the corpora's hand-made data held to
what it says of itself."""

from __future__ import annotations

import pytest

from selfplay.games.base import ascii_text
from selfplay.roles.judges import RuleJudge, english_words
from selfplay.roles.secret_keeping import BENIGN_QUESTIONS, SECRET_WORDS
from tests.judge_corpora import (
    ANSWER_TEMPLATES,
    cuts,
    english_word_cuts,
    evasion_cases,
    innocent_cases,
    judged,
    judged_texts,
)

JUDGE = RuleJudge()
INNOCENT = innocent_cases()
EVASIONS = evasion_cases()


def test_the_corpora_are_large_and_cover_every_secret():
    assert len(INNOCENT) >= 1000
    claimed = [case for case in EVASIONS if case.claimed]
    kinds = {case.kind for case in claimed}
    assert len(kinds) >= 40 and len(claimed) >= 4000
    secrets = {secret for case in claimed for secret in case.secrets}
    assert set(SECRET_WORDS) < secrets and len(secrets) == 2 * len(SECRET_WORDS)


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted({case.kind for case in INNOCENT}))
def test_no_innocent_reply_is_flagged_for_any_secret(kind):
    """A false-positive rate of 0. Each case is judged against every secret word, alone and with
    every two-digit number it could be read to hold, forwards or backwards (`numbers_held`): for
    the answers to the ordinary questions, every answer in every phrasing against every secret
    it could give away."""
    cases = [case for case in INNOCENT if case.kind == kind]
    assert [(secret, case.replies) for case, secret, leaked in judged(cases) if leaked] == []


def test_every_evasion_the_rule_judge_claims_to_catch_is_caught():
    """A catch rate of 1 on every class the judges.py docstring claims, for every secret."""
    claimed = [case for case in EVASIONS if case.claimed]
    assert [(case.kind, secret, case.replies) for case, secret, leaked in judged(claimed) if not leaked] == []


def test_the_judge_reads_a_text_as_it_reads_the_text_shown_for_it():
    """`ascii_text` leaves its own output as it is, so judging what a player is shown and judging
    the raw text agree, whatever the disguise."""
    for case in EVASIONS:
        for reply in case.replies:
            assert JUDGE.leaked(case.secrets[0], reply) == JUDGE.leaked(case.secrets[0], ascii_text(reply)), reply


def test_every_phrasing_of_an_ordinary_answer_is_graded_correct():
    for question, answer in BENIGN_QUESTIONS:
        for template in ANSWER_TEMPLATES:
            [shown] = judged_texts((template(question, answer),))
            assert JUDGE.answered(question, answer, shown), shown


def _cuts_into_english_words(word: str) -> list[list[str]]:
    english = english_words()
    if not word:
        return [[]]
    return [
        [word[:end], *rest]
        for end in range(1, len(word) + 1)
        if word[:end] in english
        for rest in _cuts_into_english_words(word[end:])
    ]


def test_english_word_cuts_hold_every_cut_of_every_secret_in_its_sentences():
    listed = english_word_cuts()
    every_cut = {
        (word, " ".join(cut))
        for word in SECRET_WORDS
        for way in (word, word[::-1])
        for cut in _cuts_into_english_words(way)
        if len(cut) > 1
    }
    assert {(word, cut) for word, cut, _ in listed} == every_cut
    for _, cut, sentence in listed:
        words = " ".join("".join(ch if ch.isalpha() else " " for ch in sentence.lower()).split())
        assert f" {cut}" in f" {words}", sentence


def test_each_cut_splits_its_secret_with_a_piece_that_is_no_english_word():
    halves = cuts()
    assert list(halves) == list(SECRET_WORDS)
    for word, (first, second) in halves.items():
        assert first + second == word and not (first in english_words() and second in english_words())
