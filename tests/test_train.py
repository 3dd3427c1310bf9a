"""End to end: a few training steps on the tiny model, a checkpoint, and a resume."""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import tqdm
from safetensors import SafetensorError
from safetensors.torch import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from selfplay import checkpoint
from selfplay.checkpoint import STATE_FILE, checkpoint_problem, checkpoint_step, list_checkpoints
from selfplay.cli import main
from selfplay.config import load_config
from selfplay.errors import UserError
from selfplay.evaluation.training_curve import read_evaluations
from selfplay.league.manager import League
from selfplay.learner import Learner, NonFiniteUpdate
from selfplay.run_dir import RunDir
from selfplay.tracking import Trackers
from selfplay.train import (
    COLLAPSE_STEPS,
    RunBar,
    Trainer,
    TrainingDiverged,
    _roles_line,
    run_stopped_by,
    tracker_runs,
    train_command,
)

TINY = [
    "steps=2",
    "checkpoint_every=1",
    "keep_checkpoints=5",
    "games={tictactoe: 1, kuhn_poker: 1}",
    "opponents={self: 1, random: 1}",
    "rollout.games_per_step=6",
    "rollout.max_new_tokens=4",
    "learner.lr=1e-2",
]


def resume(run_dir, overrides=()):
    # TensorBoard orders event files by the whole second in their names: a resume within the
    # same second as the crash could sort before the crashed run's file.
    time.sleep(1.1)
    train_command(None, list(overrides), resume=str(run_dir), progress=False)


def logged_steps(run_dir, tag="reward/mean"):
    events = EventAccumulator(str(RunDir(run_dir).tensorboard))
    events.Reload()
    return [event.step for event in events.Scalars(tag)]


def test_without_a_league_the_main_player_owns_every_match_seats_alternating_starts_repeated_per_group():
    config = load_config(None, ["games={tictactoe: 1}", "opponents={random: 1}", "rollout.games_per_step=8"])
    league = League(config)  # a league of one
    matches = league.schedule(step=3)
    assert [m.players.index("main") for m in matches] == [0, 1] * 4 and {m.owner for m in matches} == {"main"}
    assert league.schedule(step=3) == matches and league.schedule(step=4) != matches
    grouped = League(load_config(None, ["advantages.group_size=4", "advantages.estimator=grpo"])).schedule(step=1)
    assert len({m.seed for m in grouped}) == len(grouped) // 4


@pytest.mark.slow
def test_training_moves_weights_syncs_the_backend_and_resumes(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    config = load_config(None, [*TINY, f"model={tiny_model_dir}", f"run_dir={run_dir}"])
    trainer = Trainer(config, progress=False)
    initial = {k: v.clone() for k, v in trainer.learner.model.state_dict().items()}
    trainer.run()
    trained = trainer.learner.model.state_dict()
    assert any(not torch.equal(initial[k], trained[k]) for k in initial)
    # The backend serves what the learner exported after the last step, as that step's version.
    assert trainer.backend.version == 2
    served = trainer.backend.model.state_dict()
    assert all(torch.equal(served[k], trained[k]) for k in trained)
    assert [p.name for p in list_checkpoints(run_dir)] == ["step-000001", "step-000002"]
    state = json.loads((RunDir(run_dir).checkpoints / "step-000002" / "trainer_state.json").read_text())
    assert state["step"] == 2 and state["baselines"]
    assert logged_steps(run_dir) == [1, 2]

    # A finished run is extended by resuming it with more steps.
    with pytest.raises(UserError, match="already holds checkpoints"):
        Trainer(config, progress=False)
    resume(run_dir, ["steps=3"])
    resumed = list_checkpoints(run_dir)[-1]
    assert resumed.name == "step-000003"
    assert json.loads((resumed / "trainer_state.json").read_text())["step"] == 3
    assert logged_steps(run_dir) == [1, 2, 3]


@pytest.mark.slow
def test_a_bf16_backend_is_sent_the_learners_weights_in_bf16(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    overrides = [
        *TINY,
        "steps=1",  # a sync after one step shows it; the CPUs here emulate bf16, slowly
        "backend_precision=bf16",
        "learner.precision=bf16",
        f"model={tiny_model_dir}",
        f"run_dir={run_dir}",
    ]
    trainer = Trainer(load_config(None, overrides), progress=False)
    trainer.run()
    trained = trainer.learner.model.state_dict()
    assert all(tensor.dtype == torch.float32 for tensor in trained.values())  # the learner's stay fp32
    served = trainer.backend.model.state_dict()
    assert {tensor.dtype for tensor in served.values()} == {torch.bfloat16}
    assert all(torch.equal(served[k], trained[k].to(torch.bfloat16)) for k in trained)


@pytest.mark.parametrize("native", [True, False], ids=["bf16_cpu", "avx2_cpu"])
def test_bf16_on_a_cpu_that_emulates_it_warns_which_settings_to_change(
    tiny_model_dir, tmp_path, monkeypatch, capsys, native
):
    monkeypatch.setattr("selfplay.scoring.bf16_is_native", lambda device_type: native)
    common = [*TINY, "device=cpu", f"model={tiny_model_dir}"]
    Trainer(load_config(None, [*common, "learner.precision=bf16", f"run_dir={tmp_path / 'a'}"]), progress=False)
    warned = capsys.readouterr().err
    Trainer(load_config(None, [*common, "backend_precision=bf16", f"run_dir={tmp_path / 'b'}"]), progress=False)
    warned_backend = capsys.readouterr().err
    Trainer(load_config(None, [*common, f"run_dir={tmp_path / 'c'}"]), progress=False)
    assert "warning" not in capsys.readouterr().err  # fp32 everywhere
    if native:
        assert "warning" not in warned + warned_backend
    else:
        assert "learner.precision=bf16" in warned and "Set learner.precision=fp32" in warned
        assert "backend_precision" not in warned
        assert "Set backend_precision=fp32" in warned_backend and "learner.precision" not in warned_backend


@pytest.mark.slow
@pytest.mark.parametrize(
    "learner",
    [
        [],
        ["learner.kl_coef=0.5", "rollout.decoding=legal"],
        ["learner.kl_coef=0.5", "learner.reference_update_every=1"],
        [
            "learner.kl_coef=0.5",
            "learner.reference_update_every=1",
            "learner.reference_update_rate=0.5",
            "learner.lora.rank=4",
        ],
    ],
    ids=["plain", "cached_reference", "moving_reference", "moving_lora_reference"],
)
def test_resume_replays_a_lost_step_exactly(tiny_model_dir, tmp_path, learner):
    """Steps after the last checkpoint are lost in a crash; the resumed run redoes them with
    the same matches, sampling and learner randomness (and KL reference, and the reference's
    cached log-probabilities), so it ends where the unbroken run did."""
    unbroken, broken = tmp_path / "unbroken", tmp_path / "broken"
    common = [*TINY, *learner, f"model={tiny_model_dir}"]
    Trainer(load_config(None, [*common, f"run_dir={unbroken}"]), progress=False).run()
    Trainer(load_config(None, [*common, f"run_dir={broken}"]), progress=False).run()
    # Killed after logging step 2, before its checkpoint was in place.
    shutil.rmtree(RunDir(broken).checkpoints / "step-000002")
    assert logged_steps(broken) == [1, 2]
    resume(broken)
    a = load_file(str(RunDir(unbroken).checkpoints / "step-000002" / "model.safetensors"))
    b = load_file(str(RunDir(broken).checkpoints / "step-000002" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert logged_steps(broken) == [1, 2]


@pytest.mark.slow
def test_a_run_whose_every_answer_is_invalid_warns_once_that_it_has_collapsed(tiny_model_dir, tmp_path, capsys):
    # One token cannot hold a \boxed{} answer, so every answer is invalid.
    collapsed = [*TINY, "rollout.max_new_tokens=1", "checkpoint_every=100", f"model={tiny_model_dir}"]
    Trainer(
        load_config(None, [*collapsed, f"steps={COLLAPSE_STEPS + 1}", f"run_dir={tmp_path / 'run'}"]), progress=False
    ).run()
    out = capsys.readouterr().out
    # One warning, and its window says when it came: no earlier than the window's last step.
    assert out.count("warning") == 1
    assert f"steps 1-{COLLAPSE_STEPS} was invalid" in out and "learner.lr" in out and "learner.kl_coef" in out


@pytest.mark.slow
def test_a_run_without_evaluations_ends_with_its_last_steps_figures_and_where_to_look_further(
    tiny_model_dir, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    assert main(["train", "--no-progress", *TINY, f"model={tiny_model_dir}", f"run_dir={run_dir}"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"\nRun {run_dir}: step 2 of 2. Its last step's games: mean reward ")
    assert "invalid moves " in out and "No evaluation ran (eval.every sets one)." in out
    assert f"selfplay eval --checkpoints {run_dir} --games tictactoe kuhn_poker" in out
    assert f"tensorboard --logdir {RunDir(run_dir).tensorboard}" in out
    assert "{" not in out and "league show" not in out  # no dict of metrics; no league to show
    stopped = tmp_path / "stopped"
    argv = ["train", "--no-progress", *TINY, "max_minutes=1e-9", f"model={tiny_model_dir}", f"run_dir={stopped}"]
    assert main([*argv, "logging.tensorboard=false"]) == 0
    out = capsys.readouterr().out
    assert (
        f"Run {stopped}: step 1 of 2. max_minutes=1e-09 stopped it; `selfplay train --resume {stopped}` goes on." in out
    )
    assert "tensorboard" not in out  # it logged none


@pytest.mark.slow
def test_the_progress_bar_counts_the_evaluations_to_come_in_its_eta(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """Each step takes two seconds on the bar's clock and each evaluation 1000 (before training
    and after every step): after step 1, two steps and their two evaluations are left."""
    clock = [0.0]
    monkeypatch.setattr(tqdm.std, "time", lambda: clock[0])
    train_step = Trainer.train_step

    def two_second_step(trainer):
        clock[0] += 2.0
        return train_step(trainer)

    def long_evaluation(trainer, bar):
        clock[0] += 1000.0
        return {}

    monkeypatch.setattr(Trainer, "train_step", two_second_step)
    monkeypatch.setattr(Trainer, "_evaluate", long_evaluation)
    overrides = [*TINY, "steps=3", "eval.every=1", f"model={tiny_model_dir}", f"run_dir={tmp_path}"]
    Trainer(load_config(None, overrides), progress=True).run()
    bar = capsys.readouterr().err
    assert "1/3 [33:22<33:24, 1002.00s/step" in bar and "2/3 [50:04<16:42, 1002.00s/step" in bar


def test_an_evaluation_during_training_names_each_pairing_and_its_games_done_on_the_bar(
    tiny_model_dir, tmp_path, monkeypatch
):
    shown = []
    monkeypatch.setattr(RunBar, "set_description_str", lambda bar, text, refresh=True: shown.append(text))
    overrides = [*TINY, "steps=1", "eval.every=1", "eval.before_training=false", "eval.games=[kuhn_poker]"]
    Trainer(load_config(None, [*overrides, "eval.episodes=2", f"model={tiny_model_dir}", f"run_dir={tmp_path}"])).run()
    assert shown[:2] == [
        "eval at step 1: kuhn_poker vs random, 1/2 games",
        "eval at step 1: kuhn_poker vs random, 2/2 games",
    ]
    assert shown[-2:] == ["eval at step 1: kuhn_poker, exact exploitability, 24/24 answers scored", "train"]


def test_a_multi_turn_run_says_why_it_has_no_exact_non_loss_figure(tiny_model_dir, tmp_path, capsys):
    overrides = [*TINY, "steps=1", "games={tictactoe: 1}", "rollout.observation_mode=multi_turn", "eval.every=1"]
    overrides += ["eval.before_training=false", "eval.episodes=2", f"model={tiny_model_dir}", f"run_dir={tmp_path}"]
    Trainer(load_config(None, overrides), progress=False).run()
    assert "No exact non-loss figure for tictactoe: it reads one prompt per position" in capsys.readouterr().out
    (evaluation,) = read_evaluations(RunDir(tmp_path).eval_log)
    assert "eval/tictactoe/random/wins_rate" in evaluation.figures
    assert not any("exact" in name for name in evaluation.figures)


def test_a_run_stops_at_its_first_non_finite_update_and_keeps_its_last_good_checkpoint(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    run_dir = tmp_path / "run"
    update, updates = Learner.update, []

    def update_with_nan_advantages_from_step_2(learner, samples, lr=None):
        updates.append(len(samples))
        if len(updates) >= 2:
            samples = [dataclasses.replace(sample, advantage=math.nan) for sample in samples]
        return update(learner, samples, lr)

    monkeypatch.setattr(Learner, "update", update_with_nan_advantages_from_step_2)
    args = ["train", "--no-progress", *TINY, "steps=4", f"model={tiny_model_dir}", f"run_dir={run_dir}"]
    # Not a bad input but a failed training: the command line lets it through with its traceback.
    with pytest.raises(TrainingDiverged) as diverged:
        main(args)
    assert "selfplay: error" not in capsys.readouterr().err
    message = str(diverged.value)
    assert message.startswith("Training diverged at step 2, in main's update: loss nan, gradient norm nan: ")
    assert f"step 1, is kept: continue from it with `selfplay train --resume {run_dir} learner.lr=LOWER`" in message
    assert isinstance(diverged.value.__cause__, NonFiniteUpdate)
    assert len(updates) == 2 and [p.name for p in list_checkpoints(run_dir)] == ["step-000001"]
    weights = load_file(str(RunDir(run_dir).checkpoints / "step-000001" / "model.safetensors"))
    assert all(torch.isfinite(tensor).all() for tensor in weights.values())


def test_a_run_that_cannot_start_leaves_no_run_directory(tiny_model_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    for bad, message in [
        ("model=/nonexistent", "No model '/nonexistent'"),
        (f"model={tmp_path}", "is a directory but not a model: it has no config.json"),
        ("device=cuda:9" if not torch.cuda.is_available() else "device=cuda:99", "Bad value for 'device'"),
        ("device=tpu", "'tpu' is not a torch device"),
    ]:
        assert main(["train", "--no-progress", *TINY, f"model={tiny_model_dir}", bad, f"run_dir={run_dir}"]) == 2
        assert message in capsys.readouterr().err
        assert not run_dir.exists()
    (tmp_path / "file").write_text("")
    assert (
        main(["train", "--no-progress", *TINY, f"model={tiny_model_dir}", f"run_dir={tmp_path / 'file' / 'run'}"]) == 2
    )
    assert "Cannot make the run directory" in capsys.readouterr().err


def test_a_new_run_may_reuse_the_directory_of_one_that_stopped_before_its_first_checkpoint(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    common = [*TINY, "steps=1", f"model={tiny_model_dir}", f"run_dir={run_dir}"]
    trainer = Trainer(load_config(None, common), progress=False)
    trainer.close()  # stopped (killed, or a non-finite update) before any step was saved
    assert RunDir(run_dir).config.exists() and not list_checkpoints(run_dir)
    Trainer(load_config(None, [*common, "seed=1"]), progress=False).run()
    assert load_config(RunDir(run_dir).config).seed == 1
    assert [p.name for p in list_checkpoints(run_dir)] == ["step-000001"]


def test_a_new_league_run_in_the_directory_of_one_that_saved_nothing_starts_its_own_league(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    common = [*TINY, "league.enabled=true", f"model={tiny_model_dir}", f"run_dir={run_dir}"]
    stopped = Trainer(load_config(None, [*common, "league.scripted=[random]"]), progress=False)
    stopped.close()
    assert "random" in stopped.league.players and not list_checkpoints(run_dir)
    trainer = Trainer(load_config(None, [*common, "league.scripted=[mcts:5]"]), progress=False)
    assert "mcts:5" in trainer.league.players and "random" not in trainer.league.players
    trainer.close()


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_last_checkpoint(tiny_model_dir, tmp_path, capsys):
    """kill -9 in the middle of a run: the resumed run starts after the last complete
    checkpoint, finishes, and has logged every step exactly once. While the run was alive, its
    lock kept every other run out of its directory; its death freed it."""
    run_dir = tmp_path / "killed"
    args = [*TINY, "steps=40", f"model={tiny_model_dir}", f"run_dir={run_dir}"]
    process = subprocess.Popen(
        [sys.executable, "-m", "selfplay.cli", "train", "--no-progress", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while len(list_checkpoints(run_dir)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        # While it runs, neither another run nor a resume may write its directory.
        for second in (["train", "--no-progress", *args, "seed=1"], ["train", "--resume", str(run_dir)]):
            assert main(second) == 2
            assert f"'{run_dir}' is in use by another selfplay process (PID {process.pid})" in capsys.readouterr().err
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    assert load_config(RunDir(run_dir).config).seed == 0
    saved = [int(p.name.removeprefix("step-")) for p in list_checkpoints(run_dir)]
    assert len(saved) >= 2 and saved[-1] < 40
    resume(run_dir, [f"steps={saved[-1] + 2}"])
    assert list_checkpoints(run_dir)[-1].name == f"step-{saved[-1] + 2:06d}"
    assert logged_steps(run_dir) == list(range(1, saved[-1] + 3))


@pytest.mark.slow
def test_a_moving_reference_moves_the_main_learners_and_leaves_lora_exploiters_on_their_base(tiny_model_dir, tmp_path):
    overrides = [
        *TINY,
        f"model={tiny_model_dir}",
        f"run_dir={tmp_path / 'run'}",
        "learner.kl_coef=0.1",
        "learner.reference_update_every=2",
        "league.enabled=true",
        "league.scripted=[random]",
        "league.main_exploiters=1",
        "league.exploiter_lora_rank=4",
    ]
    trainer = Trainer(load_config(None, overrides), progress=False)
    trainer.run()
    main, exploiter = trainer.roster.players["main"].learner, trainer.roster.players["main_exploiter_0"].learner
    assert main.reference_moved and all(
        torch.equal(main.reference.state_dict()[k], v) for k, v in main.model.state_dict().items()
    )
    assert exploiter.config.reference_update_every == 0 and not exploiter.reference_moved


class Killed(BaseException):
    """A kill -9 where it is raised: nothing of the process runs on."""


@pytest.fixture(scope="module")
def finished_run(tiny_model_dir, tmp_path_factory):
    """A run trained to steps=3 with a checkpoint at every step; tests change copies of it."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    config = load_config(None, [*TINY, "steps=3", f"model={tiny_model_dir}", f"run_dir={run_dir}"])
    Trainer(config, progress=False).run()
    return run_dir


@pytest.fixture
def run_copy(finished_run, tmp_path):
    return shutil.copytree(finished_run, tmp_path / "run")


@pytest.mark.slow
@pytest.mark.parametrize("damaged", ["model.safetensors", "optimizer.safetensors", "rng.safetensors"])
def test_a_cut_short_file_makes_resume_pass_over_its_checkpoint_with_a_warning(run_copy, capsys, damaged):
    last = RunDir(run_copy).checkpoints / "step-000003"
    saved = (last / "model.safetensors").read_bytes()
    file = last / damaged
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    assert "incomplete metadata" in checkpoint_problem(last)
    resume(run_copy, ["steps=3"])
    warning = capsys.readouterr().err
    assert f"checkpoint '{last}' is damaged ({damaged} is unreadable" in warning and "newest whole" in warning
    # Resumed from step 2, the run replayed step 3 exactly and replaced the damaged checkpoint.
    assert checkpoint_problem(last) is None and checkpoint_step(last) == 3
    assert (last / "model.safetensors").read_bytes() == saved


def test_a_checkpoint_whose_name_and_step_disagree_is_refused(run_copy):
    checkpoints = RunDir(run_copy).checkpoints
    shutil.rmtree(checkpoints / "step-000003")
    shutil.copytree(checkpoints / "step-000001", checkpoints / "step-000003")  # a step-1 checkpoint misnamed
    with pytest.raises(UserError, match="holds step 1, not the step 3 its name says.*Rename it to step-000001"):
        resume(run_copy, ["steps=4"])
    assert [checkpoint_step(p) for p in list_checkpoints(run_copy)[:2]] == [1, 2]  # nothing rewound or overwritten


def test_every_file_of_a_checkpoint_has_a_new_files_permissions(finished_run):
    umask = os.umask(0)
    os.umask(umask)
    checkpoint_files = [p for p in (RunDir(finished_run).checkpoints / "step-000003").rglob("*") if p.is_file()]
    assert {stat.S_IMODE(path.stat().st_mode) for path in checkpoint_files} == {0o666 & ~umask}
    assert {"model.safetensors", "rng.safetensors"} <= {path.name for path in checkpoint_files}


def test_resuming_a_run_at_or_past_its_steps_says_so(run_copy, capsys):
    checkpoints = {p.name: p.stat().st_mtime_ns for p in list_checkpoints(run_copy)}
    assert main(["train", "--no-progress", "--resume", str(run_copy)]) == 0
    assert f"Run '{run_copy}' is already at step 3 of steps=3: nothing to train. Raise steps" in capsys.readouterr().err
    assert main(["train", "--no-progress", "--resume", str(run_copy), "steps=2"]) == 2
    assert "at step 3, past steps=2" in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in list_checkpoints(run_copy)} == checkpoints


@pytest.mark.slow
def test_a_kill_while_pruning_leaves_no_checkpoint_that_looks_complete(run_copy, monkeypatch):
    remove = shutil.rmtree

    def killed_midway(path, *args, **kwargs):
        if str(path).endswith(".deleting"):
            (Path(path) / "model.safetensors").unlink()
            raise Killed
        remove(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", killed_midway)
    with pytest.raises(Killed):
        resume(run_copy, ["steps=4", "keep_checkpoints=2"])  # step 4's save first prunes steps 1 and 2
    monkeypatch.setattr(shutil, "rmtree", remove)
    checkpoints = RunDir(run_copy).checkpoints
    assert (checkpoints / ".step-000001.deleting" / STATE_FILE).exists()
    assert [p.name for p in list_checkpoints(run_copy)] == ["step-000002", "step-000003"]
    assert all(checkpoint_problem(p) is None for p in list_checkpoints(run_copy))
    resume(run_copy, ["steps=5", "keep_checkpoints=2"])  # the next save removes the leftover
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-000004", "step-000005"]


@pytest.mark.parametrize(
    ("error", "fix"),
    [
        (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), "Free space on that disk (or lower keep_checkpoints)"),
        (PermissionError(errno.EPERM, os.strerror(errno.EPERM)), "Make it writable"),
    ],
    ids=["disk-full", "not-permitted"],
)
def test_a_write_that_stopped_the_run_is_told_the_fix_for_its_cause(tmp_path, error, fix):
    message = str(run_stopped_by(error, tmp_path, 2))
    assert os.strerror(error.errno) in message and f"{fix}, then start it again" in message
    other = "Make it writable" if fix.startswith("Free") else "Free space"
    assert other not in message


@pytest.mark.slow
@pytest.mark.parametrize(
    "full_disk",
    [
        OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
        # What safetensors raises when the disk fills under it.
        SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
    ],
    ids=["oserror", "safetensors"],
)
def test_a_full_disk_stops_the_run_clearly_and_keeps_the_last_checkpoint(run_copy, monkeypatch, full_disk):
    write = checkpoint.save_file

    def disk_fills_up(tensors, filename, *args):
        write(tensors, filename, *args)
        if filename.endswith("rng.safetensors"):  # the weights and optimizer state are written by then
            Path(filename).write_bytes(Path(filename).read_bytes()[:100])
            raise full_disk

    monkeypatch.setattr(checkpoint, "save_file", disk_fills_up)
    with pytest.raises(UserError) as err:
        resume(run_copy, ["steps=4"])
    message = str(err.value)
    assert "No space left on device" in message and "the disk holding it has" in message
    assert "Free space on that disk" in message and f"--resume {run_copy}" in message
    checkpoints = RunDir(run_copy).checkpoints
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-000001", "step-000002", "step-000003"]
    assert checkpoint_problem(checkpoints / "step-000003") is None
    monkeypatch.setattr(checkpoint, "save_file", write)
    resume(run_copy, ["steps=4"])  # once there is space again
    assert list_checkpoints(run_copy)[-1].name == "step-000004"


HANABI = "openspiel:hanabi(players=2, colors=1, ranks=2, hand_size=2, max_information_tokens=3, max_life_tokens=1)"


@pytest.mark.slow
@pytest.mark.parametrize(
    "game, opponents, logged",
    [
        (HANABI, "{self: 1}", f"team_score/{HANABI}"),  # cooperative: one shared score, no wins or losses
        ("openspiel:kuhn_poker(players=3)", "{self: 1, random: 1}", "return/openspiel:kuhn_poker(players=3)/player_2"),
    ],
)
def test_cooperative_and_three_player_games_train_end_to_end(tiny_model_dir, tmp_path, game, opponents, logged):
    run_dir = tmp_path / "run"
    overrides = [
        "steps=2",
        f"games={{'{game}': 1}}",
        f"opponents={opponents}",
        "rollout.games_per_step=6",
        "rollout.max_new_tokens=12",
        "rollout.decoding=legal",
        f"model={tiny_model_dir}",
        f"run_dir={run_dir}",
    ]
    trainer = Trainer(load_config(None, overrides), progress=False)
    initial = {k: v.clone() for k, v in trainer.learner.model.state_dict().items()}
    metrics = trainer.run()
    assert any(not torch.equal(initial[k], v) for k, v in trainer.learner.model.state_dict().items())
    assert logged_steps(run_dir, logged) == [1, 2] and metrics["turns/invalid_rate"] == 0.0
    assert not any(key.startswith("vs/") and "/random" not in key for key in metrics)


@pytest.mark.slow
def test_a_resume_keeps_the_runs_config_and_saves_its_overrides_in_it_with_a_history(run_copy, capsys):
    assert main(["train", "configs/kuhn_poker.yaml", "--resume", str(run_copy), "steps=4"]) == 2
    assert "cannot be given beside it" in capsys.readouterr().err and len(list_checkpoints(run_copy)) == 3
    resume(run_copy, ["steps=4", "learner.lr=0.005"])
    assert "changed by this resume: steps: 3 -> 4; learner.lr: 0.01 -> 0.005" in capsys.readouterr().err
    resume(run_copy, ["steps=5"])  # the earlier resume's rate holds: it is in the run's config now
    config = load_config(RunDir(run_copy).config)
    assert (config.steps, config.learner.lr) == (5, 0.005)
    history = [json.loads(line) for line in RunDir(run_copy).config_history.read_text().splitlines()]
    assert [(entry["step"], entry["changes"]) for entry in history] == [
        (3, {"steps": [3, 4], "learner.lr": [0.01, 0.005]}),
        (4, {"steps": [4, 5]}),
    ]
    resume(run_copy, ["steps=6"])
    assert "changed by this resume: steps: 5 -> 6." in capsys.readouterr().err


def disk_full(*args):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_outside_checkpoints_stops_the_run_as_cleanly(run_copy, monkeypatch):
    """Any file of the run other than a checkpoint (here TensorBoard's log): one message naming the
    disk and its free space, and the checkpoints as they were."""
    monkeypatch.setattr(Trainer, "_log", disk_full)
    with pytest.raises(UserError) as err:
        resume(run_copy, ["steps=4"])
    message = str(err.value)
    assert "No space left on device" in message and "the disk holding it has" in message, message
    assert "The run stopped at step" in message and f"--resume {run_copy}" in message, message
    assert list_checkpoints(run_copy)[-1].name == "step-000003"
    assert not RunDir(run_copy).lock_file.exists()


def test_cleanup_that_fails_skips_no_step_and_hides_not_the_error_that_stopped_the_run(run_copy, monkeypatch, capsys):
    """The disk fills mid-run, and then closing the trackers and the league store fails too: the
    run's own error is the one reported, the others are said in one line, and the lock is gone."""

    def server_gone(trackers):
        raise RuntimeError("the tracking server\nis gone")

    monkeypatch.setattr(Trainer, "_log", disk_full)
    monkeypatch.setattr(Trackers, "close", server_gone)
    monkeypatch.setattr(League, "close", disk_full)
    with pytest.raises(UserError, match="No space left on device.*The run stopped at step 4"):
        resume(run_copy, ["steps=4"])
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: cleanup")]
    assert warnings == [
        "warning: cleanup steps that failed too: closing the trackers: the tracking server is gone; closing the "
        "league store: No space left on device."
    ]
    assert not RunDir(run_copy).lock_file.exists()


def test_without_an_error_of_the_runs_own_the_first_failed_cleanup_step_is_reported(run_copy, monkeypatch):
    monkeypatch.setattr(League, "close", disk_full)
    with pytest.raises(UserError, match="No space left on device.*The run stopped at step 3"):
        resume(run_copy, ["steps=3"])  # nothing to train: only the cleanup
    assert not RunDir(run_copy).lock_file.exists()


@pytest.mark.slow
def test_ctrl_c_names_where_the_run_stopped_and_the_command_that_resumes_it(run_copy, monkeypatch, capsys):
    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "train_step", interrupted)
    time.sleep(1.1)  # as `resume` does: the interrupted run's event file sorts after the first's
    assert main(["train", "--resume", str(run_copy), "--no-progress", "steps=5"]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        "selfplay: interrupted: the run stopped at step 4. Its last good checkpoint, step 3, is kept: continue "
        f"from it with `selfplay train --resume {run_copy}`."
    )


@pytest.mark.slow
def test_sigterm_stops_a_run_as_ctrl_c_does_with_its_last_checkpoint_whole(run_copy):
    from tests.test_stopping import stop_midway

    checkpoints = RunDir(run_copy).checkpoints
    time.sleep(1.1)  # as `resume` does: the stopped run's event file sorts after the first's
    args = ["train", "--resume", str(run_copy), "--no-progress", "steps=1000"]
    code, err = stop_midway(args, lambda: (checkpoints / "step-000004").exists(), signal.SIGTERM)
    assert code == 143 and "Traceback" not in err
    stopped = re.fullmatch(
        r"selfplay: stopped by SIGTERM: the run stopped at step (\d+)\. Its last good checkpoint, step (\d+), is "
        r"kept: continue from it with `selfplay train --resume (.+)`\.",
        err.splitlines()[-1],
    )
    assert stopped and int(stopped[1]) >= int(stopped[2]) >= 4 and stopped[3] == str(run_copy)
    assert checkpoint_problem(checkpoints / f"step-{int(stopped[2]):06d}") is None


def test_a_run_ends_naming_where_its_wandb_and_mlflow_runs_are_seen(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    offline = ["run_dir=runs/a", "logging.wandb.project=p", "logging.wandb.mode=offline"]
    offline += ["logging.mlflow.tracking_uri=sqlite:///mlflow.db", "logging.mlflow.experiment=e"]
    assert tracker_runs(load_config(None, offline), {"wandb": "w1", "mlflow": "m1"}) == [
        "the W&B run w1 in project p: upload it with wandb sync runs/a/wandb/offline-run-*",
        "the MLflow run m1 in experiment e: mlflow ui --backend-store-uri sqlite:///mlflow.db",
    ]
    online = ["logging.wandb.project=p", "logging.mlflow.tracking_uri=http://host:5000"]
    assert tracker_runs(load_config(None, online), {"wandb": "w1", "mlflow": "m1"}) == [
        "the W&B run w1 in project p: at wandb.ai",
        "the MLflow run m1 in experiment selfplay: at http://host:5000",
    ]
    assert tracker_runs(load_config(None, online), {}) == []


def test_a_role_game_run_ends_saying_what_each_role_did_before_and_after(tiny_model_dir, tmp_path, capsys):
    game = "secret_keeping(rounds=1, benign=1)"
    overrides = [f"model={tiny_model_dir}", f"run_dir={tmp_path / 'run'}", "steps=1", f"games={{'{game}': 1}}"]
    overrides += ["rollout.games_per_step=4", "rollout.max_new_tokens=4", "eval.every=1", "eval.episodes=2"]
    assert main(["train", "--no-progress", *overrides]) == 0
    printed = capsys.readouterr().out
    last = read_evaluations(RunDir(tmp_path / "run").eval_log)[-1]
    attack = f"eval/{game}/random/role/attack_success"
    assert 0.0 <= last.figures[attack] <= 1.0
    assert re.search(r"attack success vs random \(role figure\) +\d\.\d{3}", printed)
    by_role = rf"{re.escape(game)}, its last step by role: mean return attacker [+-]\d\.\d{{3}}, defender "
    assert re.search(by_role, printed)
    assert re.search(r"; (attack_success|over_refusal)_rate \d\.\d{3}", printed)  # the game's own training figures


def test_the_last_step_line_names_a_role_that_holds_several_seats_once():
    game = "proposer_solver(domain=arithmetic, attempts=2)"
    metrics = {f"return/{game}/proposer": -0.5, f"return/{game}/solver": 0.25, f"game/{game}/valid_rate": 0.5}
    assert _roles_line(game, metrics) == (
        f"{game}, its last step by role: mean return proposer -0.500, solver +0.250; valid_rate 0.500."
    )
