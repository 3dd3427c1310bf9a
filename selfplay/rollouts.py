"""The rollout engine: many games at once, every pending model turn batched per engine.

Each game in flight has its own environment, and each seat is bound to a player: a language
model policy (a `PolicyBackend`) or a scripted agent spec such as "random" or "mcts:100".
On every tick the engine sends all waiting turns of one policy to its backend as a single
batch, and those of policies served by one engine (a LoRA learner's adapter and the league's
adapter snapshots over the same model or vLLM engine: one `engine_key`) as one batch too, each
row with its own policy (`PolicyBackend.generate_rows`). Games never wait for each other:
whoever is to move in whichever game, their turn joins the next batch. Finished games are
replaced from the queue of matches, so the batch stays full.

The engine keeps the generator busy by doing its own work while the batch samples: as each
response finishes (`PolicyBackend.generate_as_completed`), its game takes the move, lets
scripted agents answer, and has its next prompt rendered and tokenized, while the backend
goes on sampling the longer responses. Batches list games in the order they started, so
however the responses finish, the same seed gives the same batches and the same records.

The engine emits plain records (`Trajectory`, `Turn`), the learner's input.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import numpy as np

from selfplay.agents import Agent, make_agent
from selfplay.backends import Generation, PolicyBackend, SamplingSettings
from selfplay.config import RolloutConfig
from selfplay.errors import UserError
from selfplay.games import InvalidMovePolicy, TextGameEnv, UnfinishedOutput, make_env
from selfplay.legal_decoding import Choices, answer_choices
from selfplay.prompts import Message, ObservationMode, PromptStyle, batch_prompt_ids, opening_messages, state_message
from selfplay.records import MatchResult, Trajectory, Turn
from selfplay.structured_decoding import grammar_text


class RolePolicies(PolicyBackend):
    """A player with a policy of its own for each role it plays (`learner.adapter_per_role`):
    the engine gives each of its turns to the policy of the role it plays there. Its policies
    share a tokenizer and move from version to version together."""

    def __init__(self, policies: Mapping[str, PolicyBackend]):
        self.policies = dict(policies)
        first = next(iter(self.policies.values()))
        self.model_path, self.tokenizer = first.model_path, first.tokenizer
        self.shares_model = all(policy.shares_model for policy in self.policies.values())

    def of_role(self, role: str) -> PolicyBackend:
        if role not in self.policies:
            raise UserError(
                f"This player has a policy for each of the roles {', '.join(self.policies)}, and none for the role "
                f"'{role}': play it in games of those roles."
            )
        return self.policies[role]

    @property
    def version(self) -> int:
        return next(iter(self.policies.values())).version

    @version.setter
    def version(self, version: int) -> None:
        for policy in self.policies.values():
            policy.version = version

    def generate(self, prompts, sampling, choices=None, grammars=None):
        raise TypeError("a player with a policy per role generates through the policy of each turn's role (of_role)")

    def load_state(self, weights, version):
        raise TypeError("a player with a policy per role takes weights through the policy of each role")

    def load_weights(self, path, version):
        raise TypeError("a player with a policy per role takes weights through the policy of each role")

    def release_memory(self) -> None:
        for policy in self.policies.values():
            policy.release_memory()

    def close(self) -> None:
        for policy in self.policies.values():
            policy.close()


Player = PolicyBackend | str  # a model policy (or one per role: `RolePolicies`), or a scripted agent spec


@dataclass(frozen=True)
class MatchSpec:
    """One game to play: which player (by label) sits in each seat."""

    game: str
    players: tuple[str, ...]
    seed: int
    owner: str | None = None  # the learning player that trains on this game; None outside training


@dataclass(frozen=True)
class RolloutSettings:
    sampling: SamplingSettings = SamplingSettings()
    observation_mode: ObservationMode = "single_turn"
    prompt: PromptStyle = "full"
    max_turns: int | None = None  # None: each game's own maximum length
    invalid_moves: InvalidMovePolicy = InvalidMovePolicy()
    concurrency: int = 256  # games in flight at once

    @classmethod
    def from_config(cls, rollout: RolloutConfig) -> RolloutSettings:
        """How the engine samples, asks and referees games under a config's `rollout` section:
        the one conversion that training, `selfplay play`, `selfplay eval` and the probes share."""
        return cls(
            sampling=SamplingSettings(
                max_new_tokens=rollout.max_new_tokens,
                temperature=rollout.temperature,
                top_p=rollout.top_p,
                decoding=rollout.decoding,
            ),
            observation_mode=rollout.observation_mode,
            prompt=rollout.prompt,
            max_turns=rollout.max_turns,
            invalid_moves=InvalidMovePolicy(
                retries=rollout.retries,
                penalty=rollout.invalid_penalty,
                opponent_reward=rollout.invalid_opponent_reward,
                format_credit=rollout.format_credit,
            ),
            concurrency=rollout.concurrency,
        )


@dataclass(frozen=True)
class _Prompt:
    """A model turn ready to be sampled: whose it is and what the model is shown."""

    label: str
    seat: int
    messages: list[Message]
    ids: list[int]
    choices: Choices = ()  # under legal decoding, the legal answers it may write
    grammar: str = ""  # under structured decoding, the grammar its answer keeps to (EBNF)


@dataclass
class _LiveGame:
    match: MatchSpec
    env: TextGameEnv
    scripted: dict[int, Agent]  # seat -> agent, for the scripted seats
    chats: list[list[Message]]  # per seat, in multi-turn mode
    turns: list[Turn] = field(default_factory=list)
    prompt: _Prompt | None = None  # the waiting model turn, once rendered


class RolloutEngine:
    def __init__(
        self,
        players: Mapping[str, Player],
        settings: RolloutSettings = RolloutSettings(),
        styles: Mapping[str, RolloutSettings] = MappingProxyType({}),
    ):
        """An engine seating `players` by label, playing as `settings` say. `styles` gives, by
        label, how a policy is asked and sampled where it differs from `settings` (its sampling,
        prompt and observation mode), so that models trained differently meet in one engine, each
        asked as it was trained. The games' rules (turn cap, invalid moves), the concurrency and
        the sampling seed are always `settings`'."""
        self.players = dict(players)
        self.settings = settings
        self.styles = dict(styles)
        self._idle_envs: dict[str, list[TextGameEnv]] = defaultdict(list)
        self._answer_ids: dict[str, dict[str, tuple[int, ...]]] = defaultdict(dict)  # per policy label

    def run(self, matches: Iterable[MatchSpec]) -> Iterator[Trajectory]:
        """Play every match, yielding each game's trajectory as soon as it ends."""
        queue = iter(matches)
        live: list[_LiveGame] = []  # in the order the games started
        tick = 0
        while True:
            candidates = live + [self._start(m) for m in _take(queue, self.settings.concurrency - len(live))]
            live = []
            for game in candidates:  # grows as finished games are replaced
                if game.env.end_reason is not None:
                    yield self._finish(game)
                    candidates.extend(self._start(m) for m in _take(queue, 1))
                else:
                    live.append(game)
            if not live:
                return
            self._render_prompts([game for game in live if game.prompt is None])
            waiting: dict[tuple, list[_LiveGame]] = defaultdict(list)
            for game in live:
                waiting[self._batch_key(game)].append(game)
            for games in waiting.values():
                self._play_model_turns(games, tick)
            tick += 1

    # -- one game ------------------------------------------------------------------------------

    def _start(self, match: MatchSpec) -> _LiveGame:
        idle = self._idle_envs[match.game]
        env = (
            idle.pop()
            if idle
            else make_env(match.game, invalid_moves=self.settings.invalid_moves, max_turns=self.settings.max_turns)
        )
        if len(match.players) != len(env.possible_agents):
            raise ValueError(f"{match.game} has {len(env.possible_agents)} seats, match names {match.players}")
        env.reset(seed=match.seed)
        scripted = {}
        for seat, label in enumerate(match.players):
            player = self.players[label]
            if isinstance(player, str):
                agent_seed = int(np.random.SeedSequence([match.seed, seat]).generate_state(1)[0])
                scripted[seat] = make_agent(player, env.game, agent_seed)
        game = _LiveGame(match, env, scripted, chats=[[] for _ in match.players])
        self._play_scripted(game)
        return game

    def _seat_to_move(self, game: _LiveGame) -> int:
        return game.env.possible_agents.index(game.env.agent_selection)

    def _play_scripted(self, game: _LiveGame) -> None:
        env = game.env
        while env.end_reason is None:
            agent = game.scripted.get(self._seat_to_move(game))
            if agent is None:
                return
            env.step(agent.act(env))

    def _finish(self, game: _LiveGame) -> Trajectory:
        env = game.env
        result = MatchResult(
            game=game.match.game,
            seed=game.match.seed,
            players=game.match.players,
            rewards=tuple(env.episode_returns[a] for a in env.possible_agents),
            invalid_moves=tuple(len(env.invalid_log[a]) for a in env.possible_agents),
            turns=env.turns,
            end_reason=env.end_reason,
            owner=game.match.owner,
            figures=tuple(
                tuple(sorted(env.game.outcome_figures(seat).items())) for seat in range(len(env.possible_agents))
            ),
        )
        self._idle_envs[game.match.game].append(env)
        return Trajectory(result, tuple(game.turns))

    # -- model turns ---------------------------------------------------------------------------

    def _style(self, label: str) -> RolloutSettings:
        """How the policy `label` is asked and sampled."""
        return self.styles.get(label, self.settings)

    def _messages(self, game: _LiveGame, seat: int) -> list[Message]:
        observation = game.env.observe(game.env.possible_agents[seat])
        chat = game.chats[seat]
        style = self._style(game.match.players[seat])
        if style.observation_mode == "single_turn" or not chat:
            return opening_messages(observation, style.prompt)
        return [*chat, state_message(observation, style.prompt)]

    def _render_prompts(self, games: list[_LiveGame]) -> None:
        """The next prompt of each game, which waits on a model: one tokenizer call per policy."""
        by_label: dict[str, list[tuple[_LiveGame, int]]] = defaultdict(list)
        for game in games:
            seat = self._seat_to_move(game)
            by_label[game.match.players[seat]].append((game, seat))
        for label, waiting in by_label.items():
            decoding = self._style(label).sampling.decoding
            tokenizer = self.players[label].tokenizer
            messages = [self._messages(game, seat) for game, seat in waiting]
            ids = batch_prompt_ids(tokenizer, messages)
            for (game, seat), chat, prompt in zip(waiting, messages, ids):
                choices = self._choices(game, label) if decoding == "legal" else ()
                grammar = grammar_text(game.env.game.answer_grammar()) if decoding == "structured" else ""
                game.prompt = _Prompt(label, seat, chat, prompt, choices, grammar)

    def _choices(self, game: _LiveGame, label: str) -> Choices:
        """The answers legal decoding may write in `game`'s current state."""
        if not game.env.game.lists_every_move:
            raise UserError(
                f"Legal decoding writes only listed legal moves, but '{game.match.game}' takes free text: "
                "play it with free decoding."
            )
        tokenizer = self.players[label].tokenizer
        answers = [game.env.answer(move) for move in game.env.legal_moves()]
        return answer_choices(answers, tokenizer, tokenizer.eos_token_id, self._answer_ids[label])

    def _policy(self, game: _LiveGame) -> PolicyBackend:
        """The backend that plays `game`'s waiting turn: its player's, or where the player has a
        policy per role, the policy of the role it plays there."""
        player = self.players[game.prompt.label]
        if not isinstance(player, RolePolicies):
            return player
        return player.of_role(game.env.role(game.env.possible_agents[game.prompt.seat]))

    def _batch_key(self, game: _LiveGame) -> tuple:
        """Turns with one key are sampled in one batch: those of one policy, or of policies over
        one engine, asked with the same sampling settings."""
        policy = self._policy(game)
        engine = policy.engine_key
        return (id(policy) if engine is None else id(engine), self._style(game.prompt.label).sampling)

    def _play_model_turns(self, games: list[_LiveGame], tick: int) -> None:
        policies = [self._policy(game) for game in games]
        seed = int(np.random.SeedSequence([self.settings.sampling.seed, tick]).generate_state(1)[0])
        prompts = [game.prompt.ids for game in games]
        sampling = replace(self._style(games[0].prompt.label).sampling, seed=seed)
        choices = [game.prompt.choices for game in games] if sampling.decoding == "legal" else None
        grammars = [game.prompt.grammar for game in games] if sampling.decoding == "structured" else None
        backend = policies[0]
        if any(policy is not backend for policy in policies):
            batches = backend.generate_rows(policies, prompts, sampling, choices, grammars)
        else:
            batches = backend.generate_as_completed(prompts, sampling, choices, grammars)
        for finished in batches:
            moved = [games[index] for index, _ in finished]
            for game, (_, generation) in zip(moved, finished):
                self._apply(game, generation)
                self._play_scripted(game)
            self._render_prompts([game for game in moved if game.env.end_reason is None])

    def _apply(self, game: _LiveGame, generation: Generation) -> None:
        prompt, game.prompt = game.prompt, None
        env = game.env
        agent = env.possible_agents[prompt.seat]
        if self._style(prompt.label).observation_mode == "multi_turn":
            game.chats[prompt.seat] = [*prompt.messages, {"role": "assistant", "content": generation.text}]
        invalid_before = len(env.invalid_log[agent])
        finished = generation.finish_reason == "stop"
        env.step(generation.text if finished else UnfinishedOutput(generation.text))
        invalid = len(env.invalid_log[agent]) > invalid_before
        game.turns.append(
            Turn(
                game=game.match.game,
                match_seed=game.match.seed,
                seat=prompt.seat,
                role=env.role(agent),
                agent=prompt.label,
                policy_version=generation.policy_version,
                prompt_ids=tuple(prompt.ids),
                response_ids=generation.token_ids,
                logprobs=generation.logprobs,
                text=generation.text,
                finish_reason=generation.finish_reason,
                invalid=invalid,
                reward=float(env.rewards.get(agent, 0.0)),
                choices=prompt.choices,
                grammar=prompt.grammar,
                retried_penalty=env.retried_penalty,
                invalid_reason=env.invalid_log[agent][-1]["reason"] if invalid else "",
            )
        )


def _take(iterator: Iterator[MatchSpec], count: int) -> list[MatchSpec]:
    return [match for _, match in zip(range(count), iterator)]
