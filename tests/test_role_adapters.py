"""One LoRA adapter per role (`learner.adapter_per_role`): each role's turns played and learned
by its own adapter over one frozen base, each saved apart and loaded by `eval` and `play` as
RUN_DIR@ROLE; refused where it cannot apply."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from selfplay.checkpoint import latest_checkpoint, role_adapter_part, role_adapters
from selfplay.cli import main
from selfplay.config import LearnerConfig, LoraConfig, load_config
from selfplay.errors import UserError
from selfplay.learner import Learner, RoleLearners, Sample
from selfplay.model_specs import model_spec
from selfplay.rollouts import MatchSpec, RolePolicies, RolloutEngine
from selfplay.roster import training_roles
from selfplay.run_dir import RunDir
from selfplay.scoring import response_logprobs
from selfplay.train import train_command
from tests.fakes import LegalMoveBackend

ROLE_RUN = [
    "steps=2",
    "checkpoint_every=1",
    "games={secret_keeping: 1}",
    "rollout.games_per_step=4",
    "rollout.max_new_tokens=6",
    "learner.lr=1e-2",
    "learner.lora.rank=2",
    "learner.adapter_per_role=true",
]
ROLES = ["attacker", "defender"]


@pytest.fixture(scope="module")
def role_run(tiny_model_dir, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("roles") / "run"
    train_command(None, [*ROLE_RUN, f"model={tiny_model_dir}", f"run_dir={run_dir}"], None, progress=False)
    return run_dir


def _adapter(checkpoint, role) -> dict[str, torch.Tensor]:
    return load_file(str(role_adapter_part(checkpoint, role) / "adapter" / "adapter_model.safetensors"))


def test_each_role_trains_an_adapter_of_its_own_saved_apart_and_loaded_by_name(role_run, tiny_model_dir, tmp_path):
    newest = latest_checkpoint(role_run)
    assert role_adapters(newest) == ROLES
    attacker, defender = (_adapter(newest, role) for role in ROLES)
    assert attacker.keys() == defender.keys()
    moved = [name for name in attacker if "lora_B" in name]
    assert any(not torch.equal(attacker[name], defender[name]) for name in moved)
    assert all(any(adapter[name].abs().sum() > 0 for name in moved) for adapter in (attacker, defender))

    spec = model_spec(f"{role_run}@attacker")
    assert (spec.name, spec.model, spec.step) == ("run/step-000002@attacker", str(tiny_model_dir), 2)
    assert spec.weights == str(role_adapter_part(newest, "attacker") / "adapter")
    assert spec.trained_with.max_new_tokens == 6
    assert model_spec(f"{RunDir(role_run).checkpoints / 'step-000001'}@defender").step == 1
    with pytest.raises(UserError, match=r"holds an adapter for each role \(attacker, defender\), not one model"):
        model_spec(str(role_run))
    with pytest.raises(UserError, match="holds no adapter of the role 'solver': it holds adapters of the roles"):
        model_spec(f"{role_run}@solver")

    out = tmp_path / "eval"
    argv = ["eval", "--checkpoints", f"{role_run}@attacker", f"{role_run}@defender", "--games", "secret_keeping"]
    assert main([*argv, "--episodes", "2", "--no-round-robin", "--no-progress", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert "run/step-000002@attacker" in json.dumps(results) and "run/step-000002@defender" in json.dumps(results)


def test_a_resumed_run_restores_each_roles_adapter_and_optimizer(role_run, tmp_path):
    resumed = tmp_path / "run"
    shutil.copytree(role_run, resumed)
    shutil.rmtree(RunDir(resumed).checkpoints / "step-000002")
    train_command(None, [], str(resumed), progress=False)
    unbroken, again = (RunDir(run).checkpoints / "step-000002" / "adapters" for run in (role_run, resumed))
    files = sorted(path.relative_to(unbroken) for path in unbroken.rglob("*") if path.is_file())
    assert len(files) == 8  # per role: the adapter's two files, the optimizer's two
    assert all((unbroken / name).read_bytes() == (again / name).read_bytes() for name in files)


def test_each_turn_is_played_by_its_roles_policy(tokenizer):
    policies = {role: LegalMoveBackend(tokenizer, seed=i) for i, role in enumerate(ROLES)}
    for version, policy in enumerate(policies.values(), start=1):
        policy.version = version
    matches = [MatchSpec("secret_keeping", ("main", "main"), seed) for seed in range(4)]
    trajectories = list(RolloutEngine({"main": RolePolicies(policies)}).run(matches))
    turns = [turn for trajectory in trajectories for turn in trajectory.turns]
    assert {turn.role for turn in turns} == set(ROLES)
    assert all(turn.policy_version == ROLES.index(turn.role) + 1 for turn in turns)


def test_an_update_trains_each_roles_adapter_on_its_own_turns_alone(tiny_model_dir):
    config = LearnerConfig(lr=1e-2, lora=LoraConfig(rank=2, alpha=4.0))
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    learners = RoleLearners({role: Learner(str(tiny_model_dir), config, shared_base=base) for role in ROLES})
    prompt = tuple(learners.tokenizer("Guard the password.")["input_ids"])

    def adapters():
        return {
            role: {name: p.detach().clone() for name, p in learner.model.named_parameters() if "lora_" in name}
            for role, learner in learners.learners.items()
        }

    for trained in ROLES:
        before = adapters()
        with torch.no_grad():
            (logp,) = response_logprobs(learners.learners[trained].model, [prompt], [[5, 6]])
        stats = learners.scheduled_update([Sample(prompt, (5, 6), tuple(logp.tolist()), 1.0, role=trained)], 1, 2)
        assert stats and all(key.startswith(f"{trained}/") for key in stats)
        after = adapters()
        for role in ROLES:
            same = all(torch.equal(before[role][name], tensor) for name, tensor in after[role].items())
            assert same == (role != trained)


@pytest.mark.parametrize(
    "overrides, refusal",
    [
        (["learner.lora.rank=0"], "learner.adapter_per_role trains a LoRA adapter for each role"),
        (["games={kuhn_poker: 1}"], "'kuhn_poker' \\(in games\\) has no roles"),
        (["games={arithmetic: 1}"], "the run's games have one role only \\(solver\\)"),
        (["eval.games=[tictactoe]"], "'tictactoe' \\(in eval.games\\) has no roles"),
        (["league.enabled=true"], "trains the main player alone.*set league.enabled=false"),
        (["backend=vllm"], "set backend=hf, or learner.adapter_per_role=false"),
    ],
)
def test_one_adapter_per_role_is_refused_where_it_cannot_apply(overrides, refusal):
    with pytest.raises(UserError, match=refusal):
        training_roles(load_config(None, ["learner.lora.rank=2", *ROLE_RUN[2:], *overrides]))


def test_a_proposer_solver_run_has_an_adapter_per_role():
    assert training_roles(load_config(None, ["games={proposer_solver: 1}", *ROLE_RUN[-2:]])) == ["proposer", "solver"]
