"""Judging agents by the games they play: tallies, ratings and reports."""
