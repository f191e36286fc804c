"""bench.optimizers: where a validation curve first reaches a loss (what the
Muon/AdamW token ratio is made of), and the best lr of each optimizer."""

from __future__ import annotations

import math

import pytest
import torch

from bench.optimizers import CPU_SIZES, Run, compare, reach


def test_reach_interpolates_between_evaluations_and_says_never():
    curve = [(100, 6.0), (200, 5.0), (300, 4.0)]
    assert reach(curve, 5.5) == pytest.approx(150)
    assert reach(curve, 4.0) == 300
    assert reach(curve, 6.5) == 100  # already below at the first evaluation
    assert reach(curve, 3.9) is None


def test_compare_takes_each_optimizers_best_lr_and_the_tokens_to_adamws_final():
    size = CPU_SIZES[0]
    total = size.steps * size.step_tokens
    model = torch.nn.Linear(2, 2)

    def run(name, lr, finals):
        points = [(total * (i + 1) // len(finals), loss) for i, loss in enumerate(finals)]
        return Run(name, lr, model, None, None, points)

    runs = [run("adamw", 1e-3, [6.0, 5.0]), run("adamw", 3e-3, [5.8, 4.8]),
            run("muon", 1e-3, [5.2, 4.0]), run("muon", 3e-3, [5.0, 4.6])]
    row = compare(size, runs, train_tokens=10 * total)
    assert (row["adamw_lr"], row["muon_lr"], row["adamw_final_val"]) == (3e-3, 1e-3, 4.8)
    # Muon@1e-3 falls from 5.2 at half the tokens to 4.0 at the end: 4.8 a third of the way.
    assert row["muon_over_adamw_tokens"] == pytest.approx(0.5 + 0.5 * (5.2 - 4.8) / 1.2)
    assert math.isclose(row["epochs"], 0.1)
