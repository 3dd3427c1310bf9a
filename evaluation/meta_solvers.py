"""Meta-solvers: the mixture over a population that a meta-game's payoff matrix gives (PSRO).

Each solver takes payoff[i][j], what member i expects to win against member j in a symmetric
two-player zero-sum meta-game (antisymmetric: payoff[j][i] = -payoff[i][j]), and returns a
probability per member:

- `nash`: a maximin (Nash) mixture, by linear programming, identical strategies sharing their
  weight evenly;
- `prd`: OpenSpiel's projected replicator dynamics, the time-averaged strategy of replicator
  dynamics kept a little inside the simplex (PSRO's default meta-solver in OpenSpiel);
- `alpharank`: OpenSpiel's alpha-rank, the stationary distribution of a single population's
  evolutionary dynamics (alpha-PSRO), with OpenSpiel's default ranking intensity.

The LP is scipy's (HiGHS): OpenSpiel's `lp_solver` needs cvxopt, which selfplay does not install.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from open_spiel.python.algorithms import projected_replicator_dynamics as prd
from open_spiel.python.egt import alpharank as alpha_rank
from scipy.optimize import linprog


def zero_sum_nash(payoff: np.ndarray) -> tuple[np.ndarray, float]:
    """The row player's maximin mixture of a two-player zero-sum matrix game (payoff[i][j]: what
    row strategy i wins against column strategy j) and the game's value, by linear programming
    (scipy.optimize.linprog, HiGHS).

    Any finite matrix is accepted, square or not. Identical rows (interchangeable strategies, such
    as two snapshots of the same weights) share their weight evenly: the LP is solved over the
    distinct rows, and each one's weight split among its copies, which wins the same against every
    column. Where several maximin mixtures of distinct rows exist, the one returned is the solver's
    choice.
    """
    payoff = np.asarray(payoff, dtype=np.float64)
    if payoff.ndim != 2 or payoff.size == 0 or not np.isfinite(payoff).all():
        raise ValueError(f"expected a non-empty 2-D matrix of finite payoffs, got {payoff!r}")
    copies = identical_rows(payoff)
    distinct = payoff[[group[0] for group in copies]]
    rows, columns = distinct.shape
    # Variables: the mixture x and the value v. Maximise v subject to x winning at least v
    # against every column, x >= 0 and sum(x) = 1.
    result = linprog(
        c=np.r_[np.zeros(rows), -1.0],
        A_ub=np.c_[-distinct.T, np.ones(columns)],
        b_ub=np.zeros(columns),
        A_eq=np.r_[np.ones(rows), 0.0][None, :],
        b_eq=[1.0],
        bounds=[(0, None)] * rows + [(None, None)],
        method="highs",
    )
    if not result.success:  # a finite matrix game always has a solution
        raise RuntimeError(f"linprog failed on a matrix game: {result.message}")
    # The solver may leave entries a rounding error below 0.
    weights = np.clip(result.x[:rows], 0.0, None)
    weights /= weights.sum()
    mixture = np.zeros(len(payoff))
    for indices, weight in zip(copies, weights):
        mixture[indices] = weight / len(indices)
    return mixture, float(result.x[rows])


# Rows this close count as identical: far below HiGHS's own feasibility tolerance (1e-7), so that
# payoffs computed apart for two copies of one policy still match.
IDENTICAL = 1e-9


def identical_rows(payoff: np.ndarray) -> list[list[int]]:
    """The row indices of `payoff` grouped by identical rows (each within IDENTICAL of its group's
    first), in order of first appearance."""
    groups: list[list[int]] = []
    for index, row in enumerate(payoff):
        group = next((g for g in groups if np.abs(payoff[g[0]] - row).max() <= IDENTICAL), None)
        if group is None:
            groups.append([index])
        else:
            group.append(index)
    return groups


def nash(payoff: np.ndarray) -> np.ndarray:
    return zero_sum_nash(payoff)[0]


def projected_replicator_dynamics(payoff: np.ndarray) -> np.ndarray:
    # Two populations, the column player's payoffs the negation; an antisymmetric game keeps
    # them identical, so the row player's strategy is the answer.
    row, _ = prd.projected_replicator_dynamics([payoff, -payoff])
    return _distribution(row)


def alpharank(payoff: np.ndarray) -> np.ndarray:
    # One population of a symmetric game; large payoff gaps overflow a term that then tends to
    # its limit correctly, which numpy warns of.
    with np.errstate(over="ignore"):
        _, _, stationary, _, _ = alpha_rank.compute([payoff])
    return _distribution(stationary)


SOLVERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "nash": nash,
    "prd": projected_replicator_dynamics,
    "alpharank": alpharank,
}


def solve(solver: str, payoff: np.ndarray) -> np.ndarray:
    """The mixture `solver` (a key of SOLVERS) gives the meta-game `payoff` (see the module)."""
    payoff = np.asarray(payoff, dtype=np.float64)
    if payoff.ndim != 2 or payoff.shape[0] != payoff.shape[1] or payoff.size == 0 or not np.isfinite(payoff).all():
        raise ValueError(f"expected a non-empty square matrix of finite payoffs, got {payoff!r}")
    if len(payoff) == 1:
        return np.ones(1)
    return SOLVERS[solver](payoff)


def _distribution(weights: np.ndarray) -> np.ndarray:
    weights = np.clip(np.asarray(weights, dtype=np.float64).reshape(-1), 0.0, None)
    return weights / weights.sum()
