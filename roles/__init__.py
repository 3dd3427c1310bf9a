"""Roles that one shared policy plays: what each seat of an environment is asked to do,
how its reward is computed and how its advantages are grouped; and the role games, each in one
module with its roles. Built on `selfplay.games`, which never imports this package: the role
games register through the `selfplay.games` entry-point group (pyproject.toml).

- `base.py`: the `Role` record and the registry the trainer reads advantage keys from;
- `proposer_solver.py`: the proposer/solver game and its roles (after Absolute Zero), their task
  domains (`domains.py`), the task buffer (`task_buffer.py`) and the sandbox that runs proposed
  code (`sandbox.py`); `arithmetic.py`: the solver role alone on fixed expressions, its
  held-out evaluation;
- `secret_keeping.py`: the secret-keeping game and its attacker and defender roles (after
  Self-RedTeam), judged by `judges.py`.
"""
