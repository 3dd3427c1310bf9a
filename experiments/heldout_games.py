"""Held-out games played three ways: random against random, a search or solver agent (mcts or
nash, whichever applies) against random, and the tiny untrained model with legal decoding against
random. Prints one Markdown row per game: mean game length, truncated share, whether returns
summed to zero, and each pairing's result (win rate of the first agent, or the team score of a
cooperative game).

    python experiments/heldout_games.py [--episodes 20]
"""

from __future__ import annotations

import argparse
import tempfile

from selfplay.agents import applicable_agents
from selfplay.backends import SamplingSettings
from selfplay.evaluation.scoreboard import seat_outcome
from selfplay.games import make_game
from selfplay.match import play_series
from selfplay.rollouts import RolloutSettings

HANABI = "openspiel:hanabi(players=2,colors=1,ranks=2,hand_size=2,max_information_tokens=3,max_life_tokens=1)"
GAMES = [
    "openspiel:tic_tac_toe",
    "openspiel:connect_four",
    "openspiel:hex(board_size=5)",
    "openspiel:othello",
    "openspiel:dots_and_boxes",
    "openspiel:clobber",
    "openspiel:breakthrough(rows=6,columns=6)",
    "openspiel:checkers",
    "openspiel:mancala",
    "openspiel:oware",
    "openspiel:nim",
    "openspiel:pig(winscore=20)",
    "openspiel:kuhn_poker",
    "openspiel:leduc_poker",
    "openspiel:liars_dice",
    "openspiel:phantom_ttt",
    "openspiel:dark_hex(board_size=3)",
    "openspiel:first_sealed_auction",
    HANABI,
    "openspiel:kuhn_poker(players=3)",
    "openspiel:leduc_poker(players=3)",
    "pettingzoo:pettingzoo.classic.connect_four_v3",
    "pettingzoo:pettingzoo.classic.tictactoe_v3",
]


def pairing(game: str, agents: list[str], episodes: int, rollout: RolloutSettings = RolloutSettings()) -> dict:
    """`agents[0]` against the rest, seats rotating: its win rate (or the team score), the mean
    length, the truncated share and the largest |sum of returns|."""
    seats = make_game(game).num_players
    specs = agents[:1] + agents[1:] * (seats - 1) if len(agents) == 2 else agents
    results = play_series(game, specs[:seats], episodes, seed=0, rollout=rollout, progress=False)
    first = specs[0] if specs.count(specs[0]) == 1 else f"{specs[0]}#1"
    wins = sum(seat_outcome(r.rewards, r.players.index(first)) == "wins" for r in results)
    return {
        "win": wins / len(results),
        "team": sum(r.rewards[0] for r in results) / len(results),
        "length": sum(r.turns for r in results) / len(results),
        "truncated": sum(r.end_reason == "turn_cap" for r in results) / len(results),
        "sum": max(abs(sum(r.rewards)) for r in results),
        "invalid": sum(sum(r.invalid_moves) for r in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=20, help="random-vs-random games per game (default 20)")
    args = parser.parse_args()
    from selfplay.untrained_model import build_untrained

    model = f"model:{build_untrained(tempfile.mkdtemp() + '/tiny')}"
    legal = RolloutSettings(sampling=SamplingSettings(max_new_tokens=32, decoding="legal"))
    print(
        "| game | players | kind | random v random: length, truncated, first agent's win | zero-sum check "
        "| search v random | tiny model (legal) v random |"
    )
    print("|---|---|---|---|---|---|---|")
    for game in GAMES:
        twin = make_game(game)
        kind = "cooperative" if twin.cooperative else "zero-sum" if twin.zero_sum else "general-sum"
        score = "team" if twin.cooperative else "win"
        base = pairing(game, ["random", "random"], args.episodes)
        zero = "n/a" if not twin.zero_sum else ("yes" if base["sum"] < 1e-9 else f"NO ({base['sum']:.3g})")
        agents = applicable_agents(twin)
        search = "mcts:25" if "mcts" in agents else "nash" if "nash" in agents else None
        searched = "none applies"
        if search:
            row = pairing(game, [search, "random"], max(4, args.episodes // 2))
            searched = f"{search}: {score} {row[score]:.2f}, length {row['length']:.1f}"
        tiny = pairing(game, [model, "random"], max(4, args.episodes // 4), legal)
        print(
            f"| {game} | {twin.num_players} | {kind} | {base['length']:.1f}, {base['truncated']:.2f}, "
            f"{score} {base[score]:.2f} | {zero} | {searched} | {score} {tiny[score]:.2f}, invalid {tiny['invalid']}, "
            f"truncated {tiny['truncated']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
