"""Judging agents by the games they play: tallies, ratings, exploitability, meta-game solvers and
reports. The league (`selfplay.league`) is built on these measures; nothing here imports it."""
