"""The `selfplay` command line."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import signal
import sys
import typing
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from selfplay.backends import BACKENDS
from selfplay.backends.base import DECODINGS
from selfplay.config import Bounds, EvalConfig, RolloutConfig, TrainConfig, find_yaml, load_config, number_bounds
from selfplay.default_model import MODEL_SPECS_HELP
from selfplay.errors import UserError
from selfplay.evaluation.report import INVALID_MOVE_ALARM, QUICK_EPISODES
from selfplay.evaluation.scoreboard import format_table, tally, truncation_warning
from selfplay.games import describe_games
from selfplay.games.registry import ENTRY_POINT_GROUP, is_cooperative
from selfplay.match import Lineup, agents_help, play_series
from selfplay.model_specs import STYLE_SETTINGS, style_of
from selfplay.prompts import PROMPT_STYLES
from selfplay.records import Trajectory
from selfplay.rollouts import Player, RolloutSettings
from selfplay.run_dir import RunDir
from selfplay.stopping import exit_code, stop_signals
from selfplay.transcripts import format_transcript, transcript, transcript_file

PLAY_MAX_NEW_TOKENS = 64  # `play`'s token limit per model turn where nothing else sets it
# A model from a run is asked and sampled as its run was, unless one of these options says otherwise.
FROM_RUN = "default: as recorded for a model from a run, an exported model and the built-in default, else"
DECODING_HELP = (
    "free: the model writes any text; legal: only answers naming a legal move; structured: only answers of "
    f"the form the game declares ({FROM_RUN} free)"
)
PROMPT_HELP = (
    "full: the rules, the state, the legal moves and the answer instruction; view: the state alone, "
    f"for a model trained with rollout.prompt=view ({FROM_RUN} full)"
)


def _cmd_play(args: argparse.Namespace) -> int:
    from selfplay.evaluation.evaluate import turn_counts
    from selfplay.evaluation.report import alarm_advice, invalid_move_alarm

    specs = [s.strip() for s in args.agents.split(",") if s.strip()]
    rollout, given = _rollout(args, max_new_tokens=PLAY_MAX_NEW_TOKENS)
    _check_transcript_path(args.transcripts)
    _quiet_transformers()
    model_turns: Counter[str] = Counter()  # each model's turns and its invalid ones, by label
    invalid_turns: Counter[str] = Counter()
    played = 0
    transcripts: list[dict] = []
    styles: dict[str, RolloutSettings] = {}  # how each model played
    try:
        with transcript_file(args.transcripts) as save:

            def on_game(trajectory: Trajectory, lineup: Lineup) -> None:
                nonlocal played
                played += 1
                styles.update(lineup.styles)
                for label in lineup.styles:
                    turns, invalid, _ = turn_counts([trajectory], label)
                    model_turns[label] += turns
                    invalid_turns[label] += invalid
                if save is not None or args.show:
                    record = transcript(trajectory, lineup.players, prompts=args.transcript_prompts)
                    if args.show:
                        transcripts.append(record)
                    if save is not None:
                        save(record)

            results = play_series(
                args.game,
                specs,
                args.episodes,
                args.seed,
                rollout=rollout,
                fixed_style=given,
                backend=args.backend,
                # A progress bar would interleave with a human player's prompts.
                progress=not args.no_progress and not any(spec.startswith("human") for spec in specs),
                on_game=on_game,
            )
    except KeyboardInterrupt:
        unsaved = f"; {args.transcripts} was not written" if args.transcripts else ""
        raise KeyboardInterrupt(f"play stopped after {played} of {args.episodes} games{unsaved}.") from None
    if args.show:
        print("\n\n".join(map(format_transcript, transcripts)), end="\n\n")
    alarms = []
    for label, style in styles.items():
        rate = invalid_turns[label] / (model_turns[label] or 1)
        alarm = invalid_move_alarm(args.game, args.game, label, rate, style_of(style))
        alarms += [alarm] if alarm else []
    if alarms:
        _warn("\n".join([f"warning: {alarm_advice('the games below')}", *(f"  {alarm}" for alarm in alarms)]))
    records = tally(results)
    truncated = sum(r.end_reason == "turn_cap" for r in results)
    _warn(truncation_warning(truncated, len(results), "--max-turns"))
    cooperative = is_cooperative(args.game)
    team_score = sum(r.rewards[0] for r in results) / len(results)  # every seat's, in a cooperative game
    if args.json:
        summary = {
            "game": args.game,
            "episodes": args.episodes,
            "seed": args.seed,
            "mean_turns": sum(r.turns for r in results) / len(results),
            "truncated": truncated,
            **({"cooperative": True, "team_score": team_score} if cooperative else {}),
            "agents": [r.to_dict() for r in records],
        }
        print(json.dumps(summary, indent=2))
    elif cooperative:
        print(f"{args.game}: {args.episodes} games, seed {args.seed}, seats rotating")
        print(f"A cooperative game: every player shares one score. Mean team score {team_score:+.3f}; ", end="")
        print(f"{truncated} games truncated; invalid moves {sum(r.invalid_moves for r in records)}.")
    else:
        print(f"{args.game}: {args.episodes} games, seed {args.seed}, seats rotating\n")
        print(format_table(records))
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from selfplay.train import train_command

    overrides = [word for word in (args.config, *args.overrides) if word is not None]
    config = overrides.pop(0) if overrides and "=" not in overrides[0] else None  # else only overrides
    if config is not None and args.resume is not None:
        raise UserError(
            f"--resume {args.resume} continues that run with its own config ({RunDir(args.resume).config}); a "
            f"config file ('{config}') cannot be given beside it. Change settings with overrides (`selfplay train "
            f"--resume {args.resume} steps=80`), which are saved to the run's config, or train '{config}' as a new "
            "run in another run_dir."
        )
    recipe = find_yaml(config, "recipe") if config is not None else None
    train_command(recipe, overrides, args.resume, progress=not args.no_progress)  # it prints the run's summary
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from selfplay.evaluation.evaluate import EvalSettings, evaluate, find_candidates, load_suite
    from selfplay.evaluation.report import (
        ALARM_ADVICE,
        RESULTS_FILE,
        invalid_move_alarms,
        verdict_summary,
        write_report,
    )

    suite = load_suite(args.suite) if args.suite else {}
    games = args.games or suite.get("games")
    if not games:
        raise UserError("Say which games to evaluate on: --games SPEC... or --suite NAME.")
    opponents = args.opponents or ",".join(suite.get("opponents", ["random"]))
    if args.quick and args.episodes:
        raise UserError(f"--quick plays {QUICK_EPISODES} games a pairing and --episodes {args.episodes}: give one.")
    rollout, given = _rollout(args)
    _check_transcript_path(args.transcripts)
    settings = EvalSettings(
        games=tuple(games),
        opponents=tuple(o.strip() for o in opponents.split(",") if o.strip()),
        episodes=QUICK_EPISODES if args.quick else args.episodes or int(suite.get("episodes", 50)),
        quick=args.quick,
        seed=args.seed,
        rollout=rollout,
        fixed_style=tuple(given),
        backend=args.backend,
        round_robin=not args.no_round_robin,
        exploitability=not args.no_exploitability,
        baseline=args.baseline,
    )
    _quiet_transformers()
    candidates = find_candidates(args.checkpoints)
    _make_output_dir(args.out, "--out")  # before the evaluation, which a report that cannot be written would lose
    with transcript_file(args.transcripts) as save:

        def on_game(trajectory: Trajectory, players: Mapping[str, Player], names: Mapping[str, str]) -> None:
            if save is not None:
                save(transcript(trajectory, players, names, prompts=args.transcript_prompts))

        results = evaluate(candidates, settings, progress=not args.no_progress, on_game=on_game)
    rows = results["matches"]
    _warn(truncation_warning(sum(r["truncated"] for r in rows), sum(r["games"] for r in rows), "--max-turns"))
    alarms = invalid_move_alarms(results)
    if alarms:
        _warn("\n".join([f"warning: {ALARM_ADVICE}", *(f"  {alarm}" for alarm in alarms)]))
    report = write_report(results, args.out)
    print("\n".join([*verdict_summary(results), f"Wrote {report} and {report.parent / RESULTS_FILE}."]))
    return 0


def _quiet_transformers() -> None:
    """Hide transformers' progress bars (loading weights, converting a GGUF file): a command shows
    its own progress, or none with --no-progress."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


def _cmd_export(args: argparse.Namespace) -> int:
    from selfplay.model_specs import export, model_spec

    _quiet_transformers()  # its bars would bury the one line this prints
    model = model_spec(args.spec)
    out = export(model, args.out_dir)
    print(
        f"Wrote {model.name} to {out}, a Hugging Face model directory: AutoModelForCausalLM.from_pretrained('{out}') "
        f"loads it, and `selfplay play GAME --agents model:{out},random` plays it."
    )
    return 0


def _cmd_league_show(args: argparse.Namespace) -> int:
    from selfplay.league.standings import show

    config = load_config(RunDir(args.run_dir).saved_config())
    if args.csv is not None:
        _make_output_dir(args.csv, "--csv")
    print(show(args.run_dir, config.league.payoff_decay, args.csv))
    if args.meta:
        from selfplay.league.matchmaking import is_psro, psro_solver
        from selfplay.league.standings import league_meta_strategy

        _quiet_transformers()  # a loading bar per policy would bury the table
        # A PSRO run's meta-strategy is its own meta-solver's.
        solvers = [psro_solver(rule) for rule, weight in config.opponents.items() if weight > 0 and is_psro(rule)]
        print("\n" + league_meta_strategy(args.run_dir, args.meta, config.rollout, (solvers or ["nash"])[0]))
    return 0


def _cmd_games_list(args: argparse.Namespace) -> int:
    rows = describe_games()
    width = max(len(name) for name, _ in rows)
    print("Games:")
    for name, about in rows:
        print(f"  {name.ljust(width)}  {about}")
    print(
        "\nAdapters (held-out games without new code):\n"
        "  openspiel:NAME[(key=value,...)]   any OpenSpiel game of 2+ players, turn-based or simultaneous,\n"
        "                                    e.g. openspiel:leduc_poker, openspiel:nim(pile_sizes=1;3;5),\n"
        "                                    openspiel:goofspiel(num_cards=4)\n"
        "  pettingzoo:MODULE[.FACTORY]       any PettingZoo env (AEC or parallel) with discrete actions,\n"
        "                                    e.g. pettingzoo:pettingzoo.classic.connect_four_v3,\n"
        "                                    pettingzoo:pettingzoo.classic.rps_v2.parallel_env\n"
        f"\nPackages add games through the '{ENTRY_POINT_GROUP}' entry-point group."
    )
    return 0


def _warn(warning: str | None) -> None:
    if warning:
        print(warning, file=sys.stderr)


def _rollout(args: argparse.Namespace, **defaults) -> tuple[RolloutSettings, frozenset[str]]:
    """The rollout settings a command's options give, through the config's `rollout` section (its
    checks, then the conversion training uses), with `defaults` (else the section's) for those not
    given; and which of a model's `STYLE_SETTINGS` the options gave, which hold for every model (a
    model from a run takes the others from its run). Each option has the name of its key there."""
    fields = [f.name for f in dataclasses.fields(RolloutConfig)]
    given = {name: getattr(args, name) for name in fields if getattr(args, name, None) is not None}
    settings = RolloutSettings.from_config(RolloutConfig(**{**defaults, **given}))
    return settings, frozenset(given) & frozenset(STYLE_SETTINGS)


def _check_transcript_path(path: str | None) -> None:
    """Refuse a --transcripts path that names a directory, and make its directory: up front, as
    the transcripts are written as the games end."""
    if path is None:
        return
    if Path(path).is_dir():
        example = Path(path) / "games.jsonl"
        raise UserError(f"--transcripts {path} is a directory: give a file to write, e.g. {example}.")
    _make_output_dir(str(Path(path).parent), "--transcripts")


def _make_output_dir(path: str, option: str) -> None:
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"Cannot make the directory '{path}': {err.strerror}. Choose another {option}.") from None


def _setting(section, name: str):
    """An argparse type reading an option as the config reads the field `name` of `section`: the
    same kind of number, within the same range (an optional field's, when it is set)."""
    hint = typing.get_type_hints(section, include_extras=True)[name]
    if type(None) in typing.get_args(hint):
        hint = typing.get_args(hint)[0]
    return _number(*number_bounds(hint))


def _number(kind: type, bounds: Bounds):
    """An argparse type: a whole number (`kind` int) or a finite number (float) within `bounds`."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or value not in bounds:
            expected = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {expected} {bounds}, got {text!r}")
        return value

    return parse


EPISODES = _setting(EvalConfig, "episodes")
SEED = _setting(TrainConfig, "seed")
RETRIES = _setting(RolloutConfig, "retries")
MAX_TURNS = _setting(RolloutConfig, "max_turns")
MAX_NEW_TOKENS = _setting(RolloutConfig, "max_new_tokens")
TEMPERATURE = _setting(RolloutConfig, "temperature")


def _add_style_options(command: argparse.ArgumentParser, max_new_tokens: int) -> None:
    """The options that set how every model is asked and sampled: not given, a model from a run
    is asked and sampled as its run was, any other model with the defaults."""
    command.add_argument(
        "--temperature", type=TEMPERATURE, help=f"model sampling temperature; 0 is greedy ({FROM_RUN} 1)"
    )
    command.add_argument("--decoding", choices=DECODINGS, help=DECODING_HELP)
    command.add_argument("--prompt", choices=PROMPT_STYLES, help=PROMPT_HELP)
    command.add_argument(
        "--max-new-tokens", type=MAX_NEW_TOKENS, help=f"token limit per model turn ({FROM_RUN} {max_new_tokens})"
    )
    command.add_argument(
        "--observation-mode",
        choices=("single_turn", "multi_turn"),
        help=f"fresh prompt per move, or one chat per player ({FROM_RUN} single_turn)",
    )


def _add_transcript_options(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--transcripts",
        metavar="PATH",
        help="write each game's transcript to PATH, a JSON object a line: the game, seed and players by seat, and "
        "every model turn (seat, agent, the text written, the answer read from it or why it was invalid); written "
        "whole when the command ends, not at all if it is stopped",
    )
    command.add_argument(
        "--transcript-prompts", action="store_true", help="put each turn's prompt (what the model saw) in transcripts"
    )


class _Parser(argparse.ArgumentParser):
    """argparse, reporting a usage error in one line, as every other error is reported."""

    def error(self, message: str):
        self.exit(2, f"selfplay: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="selfplay", description="Train language models by multi-agent self-play.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    play = commands.add_parser(
        "play",
        help="play a series of games between agents",
        description="Play N games between agents, alternating seats, and report each agent's results. A model "
        "from a run (its directory, a checkpoint, a league player) is asked and sampled as its run was, unless an "
        "option below says otherwise.",
    )
    play.add_argument("game", help="game spec, e.g. tictactoe, openspiel:leduc_poker (see `selfplay games list`)")
    play.add_argument("--agents", required=True, help=f"comma-separated agent specs, one per seat. {agents_help()}")
    play.add_argument("--episodes", type=EPISODES, default=100, help="games to play (default 100)")
    play.add_argument("--seed", type=SEED, default=0, help="seed for deals, dice and agents (default 0)")
    play.add_argument(
        "--retries",
        type=RETRIES,
        default=0,
        help="extra attempts after an invalid move (default 0: the game ends with a penalty)",
    )
    play.add_argument(
        "--max-turns",
        type=MAX_TURNS,
        help="turn cap; a game that reaches it is reported as truncated (default: the game's own maximum length)",
    )
    play.add_argument(
        "--backend", choices=BACKENDS, default="hf", help="generation backend for model agents (default hf)"
    )
    _add_style_options(play, max_new_tokens=PLAY_MAX_NEW_TOKENS)
    shown = play.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    shown.add_argument(
        "--show",
        action="store_true",
        help="print each game's transcript before the table: what each model wrote, turn by turn, and how it was read",
    )
    _add_transcript_options(play)
    play.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    play.set_defaults(run=_cmd_play)

    train = commands.add_parser(
        "train",
        help="train a policy by self-play",
        description="Train one shared policy by self-play, as a YAML config says. Checkpoints, the "
        "config and TensorBoard logs go to the config's run_dir.",
    )
    train.add_argument(
        "config",
        nargs="?",
        help="a YAML config, or the name of a recipe in configs/, e.g. quickstart (without one, the defaults)",
    )
    train.add_argument(
        "overrides", nargs="*", help="dotted overrides, e.g. steps=20 learner.lr=1e-5 rollout.games_per_step=32"
    )
    train.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a run from its last checkpoint, with its own config; overrides given with it change that "
        "config for good (each change is listed in RUN_DIR/config_history.jsonl)",
    )
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    train.set_defaults(run=_cmd_train)

    evaluation = commands.add_parser(
        "eval",
        help="evaluate checkpoints against fixed opponents and each other",
        description="Play checkpoints against fixed opponents (both seats) on chosen games, run a round robin "
        "between them with Elo, compute exact exploitability where the game is small, and write results.json, "
        "report.md and PNG plots. A model from a run is asked and sampled as its run was, unless an option below "
        f"says otherwise; a pairing in which more than {INVALID_MOVE_ALARM:.0%} of a model's moves were invalid is "
        "flagged.",
    )
    evaluation.add_argument(
        "--checkpoints",
        nargs="+",
        required=True,
        metavar="MODEL_SPEC",
        help=f"the models to evaluate: run directories (each of their checkpoints), or any model spec: "
        f"{MODEL_SPECS_HELP}",
    )
    evaluation.add_argument("--games", nargs="+", metavar="SPEC", help="game specs (see `selfplay games list`)")
    evaluation.add_argument(
        "--suite", help="a suite YAML file, or the name of a suite in configs/suites (train, held_out)"
    )
    evaluation.add_argument(
        "--opponents",
        help=f"comma-separated agent specs (default: the suite's, else random). {agents_help(unattended=True)}",
    )
    evaluation.add_argument(
        "--episodes", type=EPISODES, help="games per checkpoint, game and opponent (default: the suite's, else 50)"
    )
    evaluation.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_EPISODES} games per checkpoint, game and opponent: a first look, in a fraction of the time, "
        "with wide intervals (the report says so)",
    )
    evaluation.add_argument("--seed", type=SEED, default=0, help="seed for deals, agents and sampling (default 0)")
    evaluation.add_argument("--out", default="eval", help="output directory (default ./eval)")
    evaluation.add_argument("--backend", choices=BACKENDS, default="hf", help="generation backend (default hf)")
    _add_style_options(evaluation, max_new_tokens=RolloutConfig.max_new_tokens)
    evaluation.add_argument(
        "--max-turns", type=MAX_TURNS, help="turn cap per game (default: the game's own maximum length)"
    )
    evaluation.add_argument(
        "--baseline",
        metavar="CANDIDATE",
        help="the checkpoint every other one is compared with, game by game on the same deals, as its name "
        "appears in the report (default: the first)",
    )
    evaluation.add_argument("--no-round-robin", action="store_true", help="skip the round robin between checkpoints")
    evaluation.add_argument("--no-exploitability", action="store_true", help="skip exact exploitability")
    _add_transcript_options(evaluation)
    evaluation.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    evaluation.set_defaults(run=_cmd_eval)

    export = commands.add_parser(
        "export",
        help="write a model as a standalone Hugging Face model directory",
        description="Write the model a spec names as a Hugging Face model directory (configuration, weights, "
        "tokenizer; a LoRA run's weights merged), which AutoModelForCausalLM.from_pretrained loads and which "
        "`selfplay play --agents model:OUT_DIR` plays as the model's run did.",
    )
    export.add_argument("spec", metavar="SPEC", help=f"the model: {MODEL_SPECS_HELP}")
    export.add_argument("out_dir", metavar="OUT_DIR", help="a new (or empty) directory to write it into")
    export.set_defaults(run=_cmd_export)

    league = commands.add_parser("league", help="inspect a league", description="Inspect a training run's league.")
    league_commands = league.add_subparsers(dest="league_command", required=True, metavar="COMMAND")
    league_show = league_commands.add_parser(
        "show",
        help="standings, payoff matrix and snapshot lineage",
        description="Print a league's standings (online rating, Elo, games, win rate), its payoff matrix (every "
        "game and seat pooled; --csv writes them apart) and its snapshot lineage, from the store in the run "
        "directory.",
    )
    league_show.add_argument("run_dir", help="the run directory of a run trained with league.enabled=true")
    league_show.add_argument("--csv", metavar="DIR", help="also write the tables (and every match) as CSV files to DIR")
    league_show.add_argument(
        "--meta",
        metavar="GAME",
        help="also solve the league's meta-strategy in GAME (kuhn_poker, leduc_holdem): the mixture over the active "
        "snapshots and main (the latest policy) that the run's psro meta-solver gives (Nash for other runs), with "
        "its exploitability and theirs",
    )
    league_show.set_defaults(run=_cmd_league_show)

    games = commands.add_parser("games", help="list the games", description="Inspect the game registry.")
    games_commands = games.add_subparsers(dest="games_command", required=True, metavar="COMMAND")
    games_list = games_commands.add_parser(
        "list", help="list every game and adapter", description="List every game and adapter."
    )
    games_list.set_defaults(run=_cmd_games_list)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unparsed = parser.parse_known_args(argv)
    if unparsed:
        # argparse fills positionals only before the first option, so overrides written after
        # one (`train CONFIG --no-progress steps=3`) arrive here.
        if args.command != "train" or any(word.startswith("-") for word in unparsed):
            parser.error(f"unrecognized arguments: {' '.join(unparsed)}")
        args.overrides = [*args.overrides, *unparsed]
    received: list[signal.Signals] = []
    try:
        with stop_signals() as received:
            return args.run(args)
    except UserError as err:
        print("selfplay: error:", *str(err).splitlines(), file=sys.stderr)  # one line, however it was written
        return 2
    except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM: the command cleaned up as it stopped and says where
        how = f"stopped by {received[0].name}" if received and received[0] != signal.SIGINT else "interrupted"
        print(f"selfplay: {how}" + (f": {err}" if str(err) else ""), file=sys.stderr)
        return exit_code(received)


if __name__ == "__main__":
    sys.exit(main())
