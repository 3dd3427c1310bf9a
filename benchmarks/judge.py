"""The Secret Keeping judge on its corpora (tests/judge_corpora.py): the false-positive rate on
innocent replies and the catch rate on evasions, by kind, each case played through the game.

    python -m benchmarks.judge [--misses N]

Run from the repository's root, as a module, since the corpora live with the tests. A false
positive is an innocent case flagged for any secret it is judged against; the figures for the
classes the rule judge claims to catch and for those it does not are given apart.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

from tests.judge_corpora import evasion_cases, innocent_cases, judged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--misses", type=int, default=3, help="examples to print of each kind's misjudged cases")
    args = parser.parse_args()
    started = time.perf_counter()

    flagged, innocent, false_alarms = defaultdict(set), innocent_cases(), defaultdict(list)
    for case, secret, leaked in judged(innocent):
        if leaked:
            flagged[case.kind].add(case.replies)
            false_alarms[case.kind].append((secret, case.replies))
    kinds = sorted({case.kind for case in innocent}, key=[case.kind for case in innocent].index)
    print(f"{'innocent replies':<58}{'cases':>7}{'judged':>9}{'flagged':>9}{'rate':>8}")
    for kind in [*kinds, "all"]:
        cases = [case for case in innocent if kind in (case.kind, "all")]
        hits = sum(len(flagged[case_kind]) for case_kind in kinds if kind in (case_kind, "all"))
        judgements = sum(len(case.secrets) for case in cases)
        print(f"{kind:<58}{len(cases):>7}{judgements:>9}{hits:>9}{hits / len(cases):>8.3f}")
    for kind, alarms in false_alarms.items():
        for secret, replies in alarms[: args.misses]:
            print(f"  false alarm ({kind}): {secret}: {replies}")

    evasions, caught = evasion_cases(), defaultdict(int)
    missed = defaultdict(list)
    for case, secret, leaked in judged(evasions):
        caught[case.kind] += leaked
        if not leaked:
            missed[case.kind].append((secret, case.replies))
    for claimed in (True, False):
        group = [case for case in evasions if case.claimed == claimed]
        kinds = sorted({case.kind for case in group}, key=[case.kind for case in group].index)
        title = "evasions the rule judge claims to catch" if claimed else "evasions it does not claim"
        print(f"\n{title:<58}{'cases':>7}{'caught':>9}{'rate':>8}")
        for kind in kinds:
            total = sum(case.kind == kind for case in group)
            print(f"{kind:<58}{total:>7}{caught[kind]:>9}{caught[kind] / total:>8.3f}")
            for secret, replies in missed[kind][: args.misses if claimed else 0]:
                print(f"  missed: {secret}: {replies}")
        total, hits = len(group), sum(caught[kind] for kind in kinds)
        print(f"{'all':<58}{total:>7}{hits:>9}{hits / total:>8.3f}")
    print(f"\n{time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
