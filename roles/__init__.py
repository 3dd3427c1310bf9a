"""Roles that one shared policy plays: what each seat of an environment is asked to do,
how its reward is computed and how its advantages are grouped."""
