"""The native games on OpenSpiel twins: TicTacToe, Connect Four, Leduc Hold'em, Liar's Dice and Nim."""

import random

import numpy as np
import pyspiel
import pytest

from selfplay.errors import UserError
from selfplay.games import make_env, make_game

GAMES = ["connect_four", "leduc_holdem", "liars_dice", "nim"]


def _set_history(game, actions):
    """Put `game` in the state OpenSpiel reaches by `actions`, chance outcomes included."""
    game.state = game.spiel_game.new_initial_state()
    for action in actions:
        game.state.apply_action(action)


def _play(game, *moves):
    for move in moves:
        assert move in game.legal_moves(), (move, game.legal_moves())
        game.apply(move)


@pytest.mark.parametrize("spec", GAMES)
def test_descriptions_tensors_and_move_names(spec):
    game = make_game(spec)
    for seed in range(20):
        game.reset(np.random.default_rng(seed))
        while not game.is_over():
            moves = game.legal_moves()
            assert len(set(moves)) == len(moves), moves
            assert [game.action_of(m) for m in moves] == game.legal_actions()
            game.apply(moves[seed % len(moves)])
    assert type(game).__doc__.strip().splitlines()[0]
    assert game.rules and game.rules.isascii()
    assert game.observation_shape == tuple(game.spiel_game.observation_tensor_shape())


# -- TicTacToe -------------------------------------------------------------------------


def test_tictactoe_board_shows_marks_and_the_numbers_of_empty_cells():
    game = make_game("tictactoe")
    _set_history(game, [4, 0, 8])
    assert game.describe(1).splitlines() == [
        "You play O. The board (empty cells show their number):",
        "O|1|2",
        "3|X|5",
        "6|7|X",
    ]


def test_tictactoe_cells_are_one_token_each_at_the_same_place_on_every_board(tokenizer):
    """With the default model's tokenizer each character of the board (a cell, a separator, a
    line break) is one token, so a model finds cell k at the same offset whatever the marks."""
    game = make_game("tictactoe")
    lengths = {0: set(), 1: set()}
    rng = random.Random(0)
    for seed in range(20):
        game.reset(np.random.default_rng(seed))
        while not game.is_over():
            player = game.current_player()
            text = game.describe(player)
            board = "\n".join(text.splitlines()[-3:])
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            assert [tokenizer.decode([i]) for i in ids[-len(board) :]] == list(board)
            lengths[player].add(len(ids))
            game.apply(rng.choice(game.legal_moves()))
    assert lengths[0] == lengths[1] and len(lengths[0]) == 1


# -- Connect Four ----------------------------------------------------------------------


def test_connect_four_vertical_line_wins_and_board_is_drawn():
    game = make_game("connect_four")
    _set_history(game, [])
    _play(game, "0", "1", "0", "1", "0", "1")
    board = game.describe(1)
    assert board.startswith("You play O.")
    assert board.splitlines()[-4:] == ["X O . . . . .", "X O . . . . .", "X O . . . . .", "0 1 2 3 4 5 6"]
    _play(game, "0")
    assert game.is_over() and game.returns() == [1.0, -1.0]


def test_connect_four_parse_move():
    game = make_game("connect_four")
    _set_history(game, [])
    for answer in ["3", "column 3", "Column 3", "col 3", " 3. "]:
        assert game.parse_move(answer) == "3", answer
    for answer in ["7", "-1", "x3", "3 4", "three", ""]:
        assert game.parse_move(answer) is None, answer
    _play(game, *["0"] * 6)
    assert game.parse_move("0") is None and game.parse_move("column 0") is None
    assert game.parse_move("1") == "1"


# -- Leduc Hold'em ---------------------------------------------------------------------

J1, J2, Q1, Q2, K1, K2 = range(6)
FOLD, CALL, RAISE = range(3)


def _leduc_showdown(card0, card1, public):
    state = pyspiel.load_game("leduc_poker").new_initial_state()
    for action in (card0, card1, CALL, CALL, public, CALL, CALL):
        state.apply_action(action)
    return state.returns()[0]


def test_leduc_card_ids_are_j_j_q_q_k_k():
    """The facts the rules text states, checked on OpenSpiel itself: rank is id // 2."""
    assert _leduc_showdown(J1, J2, Q1) == 0  # two Jacks split
    assert _leduc_showdown(Q1, Q2, K1) == 0
    assert _leduc_showdown(K1, K2, J1) == 0
    assert _leduc_showdown(J2, K1, J1) == 1  # a pair of Jacks beats a King
    assert _leduc_showdown(K1, Q1, Q2) == -1  # a pair of Queens beats a King
    assert _leduc_showdown(Q1, J1, K1) == 1  # no pair: the higher card wins
    game = make_game("leduc_holdem")
    _set_history(game, [J2, K1])
    assert "Your private card: J." in game.describe(0) and "Your private card: K." in game.describe(1)


def test_leduc_raise_sizes_and_raise_cap():
    game = make_game("leduc_holdem")
    _set_history(game, [K1, Q1])
    assert game.legal_moves() == ["check", "raise"]
    _play(game, "raise", "raise")
    assert game.legal_moves() == ["fold", "call"]
    assert "Pot: 8 chips (player_0 put in 3, player_1 put in 5)." in game.describe(0)
    assert "2 of 2 raises made this round" in game.describe(0)
    assert "To call you must put in 2 more chips." in game.describe(0)
    assert game.parse_move("raise") is None and game.parse_move("bet") is None
    _set_history(game, [K1, Q1, RAISE, RAISE, CALL, Q2])
    assert game.legal_moves() == ["check", "raise"]
    _play(game, "check", "raise", "call")
    assert game.is_over()
    # player_1 pairs the public Queen: each player put in 1 + 4 (round 1) + 4 (round 2).
    assert game.returns() == [-9.0, 9.0]
    text = game.describe(0)
    assert "Round 1 betting: player_0 raised by 2, player_1 raised by 2, player_0 called 2." in text
    assert "Round 2 betting: player_0 checked, player_1 raised by 4, player_0 called 4." in text
    assert "Showdown: player_0 held K (high card), player_1 held Q (a pair): player_1 wins the pot." in text


def test_leduc_fold_returns_the_folders_chips():
    game = make_game("leduc_holdem")
    _set_history(game, [J1, K1])
    _play(game, "raise", "fold")
    assert game.returns() == [1.0, -1.0]
    assert "player_1 folded: player_0 wins the pot." in game.describe(1)
    assert "K" not in game.describe(0)


def test_leduc_parse_move():
    game = make_game("leduc_holdem")
    _set_history(game, [J1, K1])
    cases = {"check": "check", "Check": "check", "call": "check", "raise": "raise", "bet": "raise"}
    cases.update({"Bet 2": "raise", "raise by 2": "raise", "raise 2 chips": "raise"})
    for answer, move in cases.items():
        assert game.parse_move(answer) == move, answer
    for answer in ["fold", "raise 3", "bet 4", "raise 4", "call 2", "all in", "check raise", ""]:
        assert game.parse_move(answer) is None, answer
    _play(game, "raise")
    cases = {"call": "call", "call 2": "call", "fold": "fold", "raise": "raise", "raise 2": "raise"}
    for answer, move in cases.items():
        assert game.parse_move(answer) == move, answer
    for answer in ["check", "bet", "bet 2", "call 1", "raise 4"]:
        assert game.parse_move(answer) is None, answer
    _set_history(game, [J1, K1, RAISE, CALL, Q1])
    assert game.parse_move("bet 4") == "raise" and game.parse_move("raise 2") is None


# -- Liar's Dice -----------------------------------------------------------------------


def _liars_game(*dice, spec="liars_dice"):
    game = make_game(spec)
    _set_history(game, [face - 1 for face in dice])
    return game


def test_liars_dice_highest_face_is_wild():
    game = _liars_game(6, 3)
    _play(game, "1x4", "liar")
    assert game.returns() == [1.0, -1.0]  # the 6 counts as a 4: the bid stands, the caller loses
    assert "Dice revealed: player_0 had 6; player_1 had 3. 1 die counts as 4, so player_0 wins." in game.describe(1)
    game = _liars_game(5, 3)
    _play(game, "1x4", "liar")
    assert game.returns() == [-1.0, 1.0]
    game = _liars_game(6, 4)
    _play(game, "1x1", "2x4", "liar")
    assert game.returns() == [-1.0, 1.0]  # player_1 bid 2x4, true with the wild 6


def test_liars_dice_bids_and_rules_follow_the_parameters():
    assert "Face 6 is wild" in make_game("liars_dice").rules
    assert "same quantity with a higher face" in make_game("liars_dice").rules
    variant = make_game("liars_dice(dice_sides=4, bidding_rule=reset-quantity)")
    assert "Face 4 is wild" in variant.rules and "same face with a larger quantity" in variant.rules
    game = _liars_game(4, 2, 6, 1, spec="liars_dice(numdice=2)")
    assert "Your dice: 2 4." in game.describe(0) and "Your dice: 1 6." in game.describe(1)
    assert game.legal_moves()[-1] == "4x6" and "liar" not in game.legal_moves()


def test_liars_dice_parse_move():
    game = _liars_game(2, 5)
    assert game.parse_move("liar") is None  # nothing to challenge yet
    for answer in ["1x4", "1X4", "1 x 4", "1 4", "1-4", "1,4", "1, 4", "bid 1x4", "1 4s", r"\text{1x4}"]:
        assert game.parse_move(answer) == "1x4", answer
    for answer in ["3x1", "1x7", "1x0", "0x4", "4x1", "1x4x2", "fourteen", ""]:
        assert game.parse_move(answer) is None, answer
    _play(game, "1x4")
    for answer in ["Liar", "LIAR!", "challenge", "call liar", "call"]:
        assert game.parse_move(answer) == "liar", answer
    for answer in ["1x4", "1x3", "1 1"]:
        assert game.parse_move(answer) is None, answer  # not above the current bid
    assert game.parse_move("1 5") == "1x5" and game.parse_move("2-1") == "2x1"


# -- Nim -------------------------------------------------------------------------------


@pytest.mark.parametrize("misere, returns", [(True, [1.0, -1.0]), (False, [-1.0, 1.0])])
def test_nim_last_object_rule(misere, returns):
    game = make_game(f"nim(pile_sizes=[1, 2], misere={misere})")
    _set_history(game, [])
    _play(game, "pile 2 take 2", "pile 1 take 1")
    assert game.is_over() and game.returns() == returns
    outcome = "loses" if misere else "wins"
    assert f"player_1 took the last object and {outcome}." in game.describe(0)


def test_nim_parameters():
    default = make_game("nim")
    assert default.spiel_game.get_parameters() == {"pile_sizes": "1;3;5;7", "is_misere": True}
    as_list = make_game("nim(pile_sizes=[3, 4, 5], misere=False)")
    as_string = make_game("nim(pile_sizes=3;4;5, misere=false)")
    assert str(as_list.spiel_game) == str(as_string.spiel_game)
    assert "3, 4 and 5 objects" in as_list.rules and "last object wins" in as_list.rules
    for spec in ["nim(pile_sizes=[1, 'x'])", "nim(misere=1)", "nim(pile_sizes=[1.5])"]:
        with pytest.raises(UserError):
            make_game(spec)


def test_nim_describe_and_parse_move():
    game = make_game("nim")
    _set_history(game, [])
    _play(game, "pile 3 take 2")
    text = game.describe(1)
    assert "pile 1: 1 object\n  pile 2: 3 objects\n  pile 3: 3 objects\n  pile 4: 7 objects" in text
    assert "Objects left: 14. Rule: whoever takes the last object loses." in text
    assert "Last move: player_0 took 2 from pile 3." in text
    spellings = ["pile 2 take 3", "Pile 2, take 3", "2,3", "2 3", "2-3", "(2, 3)", "pile:2, take:3;"]
    for answer in spellings + ["take 3 from pile 2", "remove 3 from pile 2", "3 objects from pile 2"]:
        assert game.parse_move(answer) == "pile 2 take 3", answer
    assert game.parse_move("take 1 from pile 4") == "pile 4 take 1"
    too_many = ["pile 2 take 4", "3,4", "pile 1 take 2", "take 8 from pile 4"]
    for answer in too_many + ["pile 5 take 1", "pile 0 take 1", "2 take 0", "pile 2 take 3 and 1", "3", ""]:
        assert game.parse_move(answer) is None, answer


# -- hidden information ----------------------------------------------------------------


def _other_worlds(spec, state, seat):
    """Histories that differ from `state`'s only in the other seat's private card or die."""
    history = state.history()
    chance = [i for i, step in enumerate(state.full_history()) if step.player == pyspiel.PlayerId.CHANCE]
    hidden = chance[1 - seat]  # one card or die each, dealt to player_0 first
    if spec == "leduc_holdem":
        choices = set(range(6)) - {history[i] for i in chance}
    else:
        choices = set(range(6)) - {history[hidden]}
    return [history[:hidden] + [value] + history[hidden + 1 :] for value in sorted(choices)]


@pytest.mark.parametrize("spec", ["leduc_holdem", "liars_dice"])
def test_state_text_hides_the_opponents_private_values(spec):
    """A player's state text is the same whatever the opponent holds, until a showdown."""
    env = make_env(spec)
    showdown_words = ("Showdown", "Dice revealed")
    checked = 0
    for seed in range(40):
        env.reset(seed=seed)
        rng = random.Random(seed)
        while True:
            game, real = env.game, env.game.state
            for seat, agent in enumerate(env.possible_agents):
                text = env.observe(agent)["state"]
                if any(word in text for word in showdown_words):
                    continue
                for other in _other_worlds(spec, real, seat):
                    _set_history(game, other)
                    assert env.observe(agent)["state"] == text
                    checked += 1
                game.state = real
            if env.end_reason is not None:
                break
            env.step(env.answer(rng.choice(env.legal_moves())))
    assert checked > 500
