"""Roles that one shared policy plays: what each seat of an environment is asked to do,
how its reward is computed and how its advantages are grouped.

- `base.py`: the `Role` record and the registry the trainer reads advantage keys from;
- `proposer_solver.py`: the proposer and solver roles (after Absolute Zero), their task domains
  (`domains.py`), the task buffer (`task_buffer.py`) and the sandbox that runs proposed code
  (`sandbox.py`);
- `red_team.py`: the attacker and defender roles of the secret-keeping game (after
  Self-RedTeam), judged by `judges.py`.
"""
