"""Learning-rate schedules.

``constant``: eta_0. ``inverse``: eta_0 / (1 + t) (ADEL-FL Sec. 4). ``salf-theorem``:
2 / (rho_c (gamma + t)) (SALF Theorem 1). ``step``: eta_0 d^k, k the number of milestones
at or below the user's round t + 1 (the step decay of Cho et al.'s Power-of-choice
experiments: halved at round 150, quartered at 300). Rounds t are 0-based.
"""

from __future__ import annotations

SCHEDULES = ("constant", "inverse", "salf-theorem", "step")


def learning_rate(
    schedule: str,
    lr: float,
    round_index: int,
    rho_c: float = 1.0,
    gamma: float = 1.0,
    milestones: tuple = (),
    decay: float = 0.5,
) -> float:
    """The learning rate of round ``round_index`` under ``schedule``."""
    t = round_index
    if schedule == "step":
        return lr * decay ** sum(1 for m in milestones if m <= t + 1)
    if schedule == "inverse":
        return lr / (1.0 + t)
    if schedule == "salf-theorem":
        return 2.0 / (rho_c * (gamma + t))  # SALF Theorem 1
    if schedule == "constant":
        return lr
    raise ValueError(f"unknown learning-rate schedule {schedule!r} (known: {', '.join(SCHEDULES)})")


def train_learning_rate(train, round_index: int) -> float:
    """The learning rate of round ``round_index`` for a ``[train]`` section (lr, lr_schedule,
    lr_rho_c, lr_gamma, lr_milestones, lr_decay)."""
    return learning_rate(
        train.lr_schedule, train.lr, round_index, train.lr_rho_c, train.lr_gamma,
        tuple(train.lr_milestones), train.lr_decay,
    )  # fmt: skip
