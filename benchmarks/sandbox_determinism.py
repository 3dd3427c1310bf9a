"""The sandbox's determinism check on generated tasks: how many of each class `Sandbox.verify`
accepts and refuses. Every deterministic task should be accepted and every task of a class the
check catches refused; the classes it catches only when two runs happen to differ, or not at all
(see roles/sandbox.py), show how often.

    python benchmarks/sandbox_determinism.py [--per-class 30] [--seed 0] [--isolation bubblewrap]
"""

from __future__ import annotations

import argparse
import random
import string
import time
from collections.abc import Callable

from selfplay.roles.sandbox import ISOLATIONS, Sandbox

# A class of tasks: a function of a seeded generator that returns a task's source and argument.
TaskMaker = Callable[[random.Random], tuple[str, str]]


def _words(rng: random.Random, count: int) -> list[str]:
    """`count` distinct lowercase words."""
    words: set[str] = set()
    while len(words) < count:
        words.add("".join(rng.choices(string.ascii_lowercase, k=rng.randint(1, 6))))
    return sorted(words)


def _task_class(
    *templates: str, argument: Callable[[random.Random], object] = lambda rng: rng.randint(0, 99)
) -> TaskMaker:
    """Tasks made from templates "IMPORTS|BODY": `IMPORTS` then `def f(x):` with that body, its
    constants {a}, {m} and {c} drawn at random, called on a generated argument."""

    def make(rng: random.Random) -> tuple[str, str]:
        template = rng.choice(templates).format(a=rng.randint(2, 9), m=rng.randint(10, 999), c=rng.choice("aeiou"))
        imports, _, body = template.partition("|")
        return f"{imports}\ndef f(x):\n    " + body.replace("\n", "\n    "), repr(argument(rng))

    return make


def _strings(low: int, high: int) -> Callable[[random.Random], list[str]]:
    return lambda rng: _words(rng, rng.randint(low, high))


def _integers(rng: random.Random) -> list[int]:
    return [rng.randint(-50, 50) for _ in range(rng.randint(1, 8))]


DETERMINISTIC: dict[str, TaskMaker] = {
    "arithmetic": _task_class(
        "|return sum(i * {a} % {m} for i in range(x))",
        "|return [x // {a}, x % {a}, x ** 2 - {m}]",
        "|return divmod(x * {m}, {a})",
    ),
    "string operations": _task_class(
        "|return x[::-1].upper() + str(len(x))",
        "|return ''.join(sorted(x))",
        "|return x.replace('{c}', '-').split('-')",
        argument=lambda rng: "".join(_words(rng, 3)),
    ),
    "sorted sets of strings": _task_class(
        "|return sorted(set(x))",
        "|return len(set(x + x))",
        "|return sorted(frozenset(x) - {{x[0]}})",
        argument=_strings(2, 8),
    ),
    "sets of integers": _task_class(
        "|return list(set(x))", "|return {{v % {a} for v in x}}", "|return sorted(set(x), key=abs)", argument=_integers
    ),
    "dicts in insertion order": _task_class(
        "|return {{w: len(w) for w in x}}", "|return list(dict.fromkeys(x + x))", argument=_strings(2, 8)
    ),
    "seeded random": _task_class(
        "import random|r = random.Random(x)\nreturn [r.randrange({m}) for _ in range(5)]",
        "import random|random.seed(x)\nreturn random.sample(range({m}), 4)",
    ),
    "digests": _task_class(
        "import hashlib|return hashlib.sha256(str(x).encode()).hexdigest()[:{a}]",
        "import zlib|return zlib.crc32(bytes(range(x % 256)))",
    ),
    "dates": _task_class(
        "import datetime|return (datetime.date(2024, 1, 1) + datetime.timedelta(days=x)).isoformat()",
        "import calendar|return calendar.weekday(2024, x % 12 + 1, {a})",
    ),
}

NONDETERMINISTIC: dict[str, TaskMaker] = {
    "set order, 6 to 9 strings": _task_class(
        "|return list(set(x))",
        "|return ''.join(set(x))",
        "|return set(x)",
        "|return [w.upper() for w in set(x)]",
        argument=_strings(6, 9),
    ),
    "string hashes": _task_class(
        "|return hash(x[0]) % 1000003",
        "|return {{w: hash(w) for w in x}}",
        "|return hash(tuple(x))",
        "|return hash(x[0].encode())",
        argument=_strings(1, 4),
    ),
    "object addresses": _task_class(
        "|return id(object())",
        "|return repr(object())",
        "|return hash(object())",
        "|return str(lambda: x)",
        "|return id(x) % 1000003",
    ),
    "clocks": _task_class(
        "import time|return time.time()",
        "import time|return time.perf_counter_ns()",
        "import time|return time.monotonic_ns() + x",
        "import datetime|return datetime.datetime.now().isoformat()",
    ),
    "random, unseeded": _task_class(
        "import random|return random.random()",
        "import random|return random.sample(range({m}), 5)",
        "import random|return random.getrandbits(64)",
        "import random|y = list(range(12))\nrandom.shuffle(y)\nreturn y",
    ),
    "the operating system's randomness": _task_class(
        "import uuid|return str(uuid.uuid4())",
        "import secrets|return secrets.token_hex(8)",
        "import random|return random.SystemRandom().random()",
        "import random|return random.Random().random()",
    ),
}

# Nondeterministic classes the check catches only when the runs' outputs happen to differ: the few
# orders of a small set, a coin flip under two seeds, addresses laid out alike, a clock's date.
PARTLY_CAUGHT: dict[str, TaskMaker] = {
    "set order, 2 strings": _task_class("|return list(set(x))", "|return ''.join(set(x))", argument=_strings(2, 2)),
    "set order, 3 to 5 strings": _task_class(
        "|return list(set(x))", "|return ''.join(set(x))", argument=_strings(3, 5)
    ),
    "coin flips": _task_class(
        "import random|for _ in range(x):\n    random.random()\nreturn random.randint(0, 1)",
        "import random|return random.choice('ab' * x)",
    ),
    "order of addresses": _task_class(
        "|y = [object() for _ in range({a})]\nreturn sorted(range({a}), key=lambda i: id(y[i]))",
        "|y = [[i] for i in range({a})]\nreturn [v[0] for v in sorted(y, key=id)]",
    ),
    "coarse clocks": _task_class(
        "import datetime|return datetime.date.today().isoformat()", "import time|return time.gmtime().tm_hour"
    ),
}


def generate(classes: dict[str, TaskMaker], per_class: int, seed: int) -> list[tuple[str, str, str]]:
    """`per_class` tasks of each class, as (class, source, argument), the same for the same seed."""
    rng = random.Random(seed)
    return [(name, *make(rng)) for name, make in classes.items() for _ in range(per_class)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-class", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--isolation", choices=ISOLATIONS, default="bubblewrap")
    args = parser.parse_args()
    sandbox = Sandbox(isolation=args.isolation)
    started = time.perf_counter()
    for title, classes in (
        ("deterministic: should be accepted", DETERMINISTIC),
        ("nondeterministic: should be refused", NONDETERMINISTIC),
        ("nondeterministic: refused only when two runs differ", PARTLY_CAUGHT),
    ):
        tasks = generate(classes, args.per_class, args.seed)
        results = sandbox.verify_many([(source, "f", argument) for _, source, argument in tasks])
        print(f"{title}\n{'class':<38}{'accepted':>10}{'refused':>10}")
        for name in classes:
            verdicts = [result.ok for (task_class, _, _), result in zip(tasks, results) if task_class == name]
            print(f"{name:<38}{sum(verdicts):>10}{verdicts.count(False):>10}")
    print(f"{args.isolation}, {args.per_class} tasks a class: {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
