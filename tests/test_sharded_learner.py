"""The learner sharded over two processes (FSDP2 over gloo, on the CPU): it learns as one process
does, repeats itself exactly, resumes across process counts, streams whole weights, stops a run
cleanly when one of its processes dies, and ends every process within seconds of an interrupt
or of the trainer's end."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
import torch
from safetensors.torch import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import AutoModelForCausalLM

from selfplay import sharding
from selfplay.checkpoint import checkpoint_problem, list_checkpoints
from selfplay.config import LearnerConfig, LoraConfig, load_config
from selfplay.distributed.cluster import check_learner_gpus
from selfplay.distributed.learner_group import LearnerGroup
from selfplay.errors import UserError
from selfplay.run_dir import RunDir
from selfplay.train import Trainer, train_command

# Ray clusters and several learner processes each want the cores to themselves: one worker runs them all.
pytestmark = [pytest.mark.xdist_group("whole_machine"), pytest.mark.slow]

STEPS = 2
RUN = [
    f"steps={STEPS}",
    "checkpoint_every=1",
    "keep_checkpoints=5",
    "games={tictactoe: 1, kuhn_poker: 1}",
    "opponents={self: 1, random: 1}",
    "rollout.games_per_step=8",
    "rollout.decoding=legal",
    "rollout.prompt=view",
    "learner.lr=3e-4",
    "learner.micro_batch_tokens=512",  # several micro-batches a step, shared out between the processes
    "learner.kl_coef=0.05",  # a sharded reference too,
    "learner.reference_update_every=2",  # which moves, and so is saved in the checkpoints
]
# What every weight may differ by after STEPS updates on two processes against one: the order of
# floating-point sums (across processes, and in the prompt prefix one process shares) differs.
WEIGHT_TOLERANCE = 2e-5


def train(tiny_model_dir, run_dir, processes: int, extra=()):
    config = load_config(
        None, [*RUN, f"model={tiny_model_dir}", f"run_dir={run_dir}", f"learner.processes={processes}", *extra]
    )
    Trainer(config, progress=False).run()
    return run_dir


def weights(run_dir, step: int = STEPS) -> dict[str, torch.Tensor]:
    return load_file(str(RunDir(run_dir).checkpoints / f"step-{step:06d}" / "model.safetensors"))


def scalars(run_dir) -> dict[str, list[float]]:
    events = EventAccumulator(str(RunDir(run_dir).tensorboard))
    events.Reload()
    return {
        tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"] if not tag.startswith("time/")
    }


def largest_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[name] - b[name]).abs().max().item() for name in a)


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    """The same run on one process and, twice, on two; and on two recomputing activations."""
    root = tmp_path_factory.mktemp("sharded")
    return {
        "one": train(tiny_model_dir, root / "one", 1),
        "two": train(tiny_model_dir, root / "two", 2),
        "two_again": train(tiny_model_dir, root / "two_again", 2),
        "two_checkpointed": train(tiny_model_dir, root / "checkpointed", 2, ["learner.activation_checkpointing=true"]),
    }


def test_two_processes_make_the_update_one_process_makes(runs):
    assert largest_difference(weights(runs["one"]), weights(runs["two"])) < WEIGHT_TOLERANCE
    assert largest_difference(weights(runs["one"]), weights(runs["two_checkpointed"])) < WEIGHT_TOLERANCE
    one, two = scalars(runs["one"]), scalars(runs["two"])
    assert one.keys() == two.keys()
    for tag in ("learner/loss", "learner/grad_norm", "learner/kl", "learner/entropy", "learner/tokens", "reward/mean"):
        assert two[tag] == pytest.approx(one[tag], rel=1e-4, abs=1e-6), tag


def test_a_sharded_run_repeats_itself_byte_for_byte(runs):
    for step in range(1, STEPS + 1):
        path = f"checkpoints/step-{step:06d}/model.safetensors"
        assert (runs["two"] / path).read_bytes() == (runs["two_again"] / path).read_bytes()
    assert scalars(runs["two"]) == scalars(runs["two_again"])


def test_a_sharded_checkpoint_holds_the_training_state_sharded_and_is_whole(runs):
    checkpoint = list_checkpoints(runs["two"])[-1]
    assert (checkpoint / "training_state" / ".metadata").is_file()
    assert not (checkpoint / "optimizer.safetensors").exists()
    assert not (checkpoint / "reference.safetensors").exists()  # the moved reference is sharded too
    assert checkpoint_problem(checkpoint) is None
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)  # what eval and play load
    assert (
        largest_difference(dict(model.state_dict()), {**weights(runs["two"]), "lm_head.weight": model.lm_head.weight})
        == 0
    )


@pytest.mark.parametrize(("saved_by", "resumed_on"), [("two", 1), ("one", 2)])
def test_a_run_resumes_on_another_process_count(runs, tmp_path, saved_by, resumed_on):
    """The last step's checkpoint lost: the resumed run, on the other process count, redoes it
    and ends where the unbroken run did."""
    run_dir = shutil.copytree(runs[saved_by], tmp_path / "run")
    shutil.rmtree(RunDir(run_dir).checkpoints / f"step-{STEPS:06d}")
    train_command(None, [f"learner.processes={resumed_on}"], resume=str(run_dir), progress=False)
    assert largest_difference(weights(runs[saved_by]), weights(run_dir)) < WEIGHT_TOLERANCE


def test_streamed_weights_are_the_whole_state_and_write_a_sharded_model_directory(
    tiny_model_dir, tmp_path, monkeypatch
):
    group = LearnerGroup(str(tiny_model_dir), LearnerConfig(processes=2))
    try:
        streamed = dict(group.policy_weights())
        saved = load_file(str(tiny_model_dir / "model.safetensors"))
        assert streamed.keys() == saved.keys()
        assert all(torch.equal(streamed[name], saved[name]) for name in saved)
        # Files of at most 1 MB: the weights go over several, with an index, one file at a time.
        monkeypatch.setattr(sharding, "MAX_FILE_BYTES", 2**20)
        group.save_pretrained(tmp_path / "model")
    finally:
        group.close()
    files = sorted(p.name for p in (tmp_path / "model").glob("model-*.safetensors"))
    assert len(files) > 1 and (tmp_path / "model" / "model.safetensors.index.json").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32).state_dict()
    assert all(torch.equal(loaded[name], saved[name]) for name in saved)


def test_a_learner_process_that_dies_stops_the_run_naming_its_last_checkpoint(tiny_model_dir, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    config = load_config(
        None, [*RUN, "steps=6", f"model={tiny_model_dir}", f"run_dir={run_dir}", "learner.processes=2"]
    )
    trainer = Trainer(config, progress=False)
    save = trainer.save

    def save_then_kill_a_peer():
        saved = save()
        if trainer.step == 2:
            os.kill(trainer.learner.peers[0].pid, signal.SIGKILL)
        return saved

    monkeypatch.setattr(trainer, "save", save_then_kill_a_peer)
    with pytest.raises(UserError) as stopped:
        trainer.run()
    message = str(stopped.value)
    assert "learner process 1 stopped (killed by signal 9)" in message
    assert f"step 2, is kept: continue from it with `selfplay train --resume {run_dir}`" in message
    assert [p.name for p in list_checkpoints(run_dir)] == ["step-000001", "step-000002"]
    assert checkpoint_problem(list_checkpoints(run_dir)[-1]) is None


def test_a_learner_process_that_dies_while_a_resume_loads_its_state_stops_it_with_one_message(
    runs, tmp_path, monkeypatch
):
    run_dir = shutil.copytree(runs["two"], tmp_path / "run")
    load = LearnerGroup.load_training_state

    def kill_a_peer_then_load(group, directory):
        os.kill(group.peers[0].pid, signal.SIGKILL)
        group.peers[0].join()
        load(group, directory)

    monkeypatch.setattr(LearnerGroup, "load_training_state", kill_a_peer_then_load)
    with pytest.raises(UserError) as stopped:
        train_command(None, [f"steps={STEPS + 1}"], resume=str(run_dir), progress=False)
    assert str(stopped.value) == (
        f"The run stopped at step {STEPS}: learner process 1 stopped (killed by signal 9). Its last good checkpoint, "
        f"step {STEPS}, is kept: continue from it with `selfplay train --resume {run_dir}`."
    )


def test_an_interrupt_ends_every_learner_process_within_seconds_even_waiting_on_a_stopped_one(tiny_model_dir):
    """SIGINT reaches the trainer while it waits in a collective for a peer that is stopped
    (SIGSTOP): Python would run no handler until the collective's timeout."""
    # Python's own SIGINT handler, whatever an earlier test in this process left: the watch hooks
    # the signal's wakeup, which only a Python-level handler writes.
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    group = LearnerGroup(str(tiny_model_dir), LearnerConfig(processes=2))
    peer = group.peers[0]
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    assert wakeup == group.interrupt_watch.writing  # the watch is what the signal wakes
    os.kill(peer.pid, signal.SIGSTOP)
    interrupt = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    never_hang = threading.Timer(30.0, peer.kill)  # what ends the call otherwise, in this test
    interrupt.start()
    never_hang.start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            group.held_bytes()  # gathers from every process
    finally:
        never_hang.cancel()
        peer.kill()
        group.close()  # even after a failure: a group left open would hold this process's gloo group
        signal.signal(signal.SIGINT, handler)
    assert time.monotonic() - started < 10
    assert peer.exitcode == -signal.SIGKILL


def test_the_learner_processes_end_with_a_trainer_killed_without_cleanup(tiny_model_dir):
    trainer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from selfplay.config import LearnerConfig; "
            "from selfplay.distributed.learner_group import LearnerGroup; "
            f"group = LearnerGroup({str(tiny_model_dir)!r}, LearnerConfig(processes=2)); "
            "print(group.peers[0].pid, flush=True); time.sleep(300)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        peer = psutil.Process(int(trainer.stdout.readline()))
    finally:
        trainer.kill()
        trainer.wait()
    try:
        peer.wait(timeout=10)
    except psutil.TimeoutExpired:
        peer.kill()
        pytest.fail("the learner process outlived its trainer by 10 s")


def test_settings_the_sharded_learner_cannot_take_are_refused_with_the_reason(tiny_model_dir):
    cores = os.cpu_count()
    with pytest.raises(
        UserError, match=f"learner.processes={cores + 1} needs a CPU core per process; this machine has {cores}"
    ):
        LearnerGroup(str(tiny_model_dir), LearnerConfig(processes=cores + 1))
    with pytest.raises(UserError, match="LoRA adapters are small enough for one process"):
        LearnerConfig(processes=2, lora=LoraConfig(rank=8))
    with pytest.raises(UserError, match="set learner.processes above 1"):
        LearnerConfig(offload=True)


def test_a_sharded_learner_trains_with_ray_rollout_workers_as_without(runs, tiny_model_dir, tmp_path):
    """One rollout worker plays the games a run without Ray plays; the sharded learner streams
    its weights to the worker and to the trainer's evaluating backend."""
    import ray

    try:
        run_dir = train(tiny_model_dir, tmp_path / "run", 2, ["steps=2", "distributed.rollout_workers=1"])
    finally:
        ray.shutdown()
    with_ray, without = scalars(run_dir), scalars(runs["two"])
    for tag in ("reward/mean", "learner/tokens", "turns/per_step"):  # the same games
        assert with_ray[tag] == without[tag][:2], tag
    # The worker samples on one thread, the trainer on two: the sampler's log-probs, and so the
    # importance weights, differ in their last bits.
    assert largest_difference(weights(runs["two"], 2), weights(run_dir, 2)) < 10 * WEIGHT_TOLERANCE


def test_a_ray_node_offering_the_learners_gpus_to_rollout_workers_is_refused():
    nodes = [
        {"Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 32.0, "GPU": 8.0}},
        {"Alive": True, "NodeManagerAddress": "10.0.0.2", "Resources": {"CPU": 32.0, "GPU": 8.0}},
    ]
    with pytest.raises(UserError, match=r"takes 4 of this machine's 8 GPUs.*offers rollout workers 8.*--num-gpus=4"):
        check_learner_gpus(4, nodes, "10.0.0.1", gpus_here=8)
    nodes[0]["Resources"]["GPU"] = 4.0  # started with --num-gpus=4: the learner keeps the other four
    check_learner_gpus(4, nodes, "10.0.0.1", gpus_here=8)


def test_gathered_tensors_arrive_on_the_gathering_process_device_however_nested(monkeypatch):
    """Each process's tensors come back on the caller's device, through the containers the
    learner nests them in (log-probs by sample, per-lag figures, memory figures): here this
    process's device is 'meta', and the other process's tensors arrive on the CPU, as unpickled."""
    shards = sharding.Shards(rank=0, processes=2, device="meta")
    value = ({0: torch.zeros(3), 2: torch.zeros(1)}, [{"lag": torch.zeros(2)}, 7], "text", None)

    def all_gather_object(values, mine):
        values[:] = [mine, mine]

    monkeypatch.setattr(sharding.dist, "all_gather_object", all_gather_object)
    gathered = shards.gather(value)

    def devices(value) -> set[str]:
        if isinstance(value, torch.Tensor):
            return {value.device.type}
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else []
        return set().union(*map(devices, items))

    assert devices(gathered) == {"meta"}
    for part in gathered:
        assert type(part) is tuple and type(part[1]) is list and part[1][1:] == [7] and part[2:] == ("text", None)
        assert part[0].keys() == {0, 2} and part[0][0].shape == (3,)
