"""Cleanup that runs every step whatever the others do: a step that fails does not skip the rest,
and it does not hide the error that stopped the work."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable

from selfplay.errors import in_one_line


def close_all(steps: Iterable[tuple[str, Callable[[], object]]], failing: bool = False) -> None:
    """Run each `(what, step)` of `steps`, in order, whatever the others raise. The first error is
    raised and any later ones said in one warning line; with `failing` (the work being cleaned up
    after has an error of its own, which comes first) every one is said in that line and none raised."""
    errors: list[tuple[str, BaseException]] = []
    for what, step in steps:
        try:
            step()
        except BaseException as err:  # KeyboardInterrupt too: the remaining steps still run
            errors.append((what, err))
    told = errors if failing else errors[1:]
    if told:
        also = "; ".join(f"{what}: {in_one_line(err)}" for what, err in told)
        print(f"warning: cleanup steps that failed too: {also}.", file=sys.stderr)
    if errors and not failing:
        raise errors[0][1]
