import math

import numpy as np
import pytest

from common.config import ScheduleSection
from common.nn.optimizers import peak_learning_rate
from common.nn.schedules import WarmupDecay, build_schedule


def values(schedule, steps):
    return np.array([float(schedule(s)) for s in steps])


def test_peak_learning_rate_scaling():
    assert peak_learning_rate(0.001, ScheduleSection(scaling="linear", base_batch_size=64), 256) == pytest.approx(0.004)
    assert peak_learning_rate(0.001, ScheduleSection(scaling="sqrt", base_batch_size=64), 256) == pytest.approx(0.002)
    assert peak_learning_rate(0.001, ScheduleSection(scaling="none", base_batch_size=64), 256) == pytest.approx(0.001)


def test_linear_warmup_then_step_decay_mlperf_style():
    # 10 steps/epoch, 4 warmup epochs from the base LR 0.001 to 0.004, x0.25 at epoch 32, x0.125 at 64.
    cfg = ScheduleSection(scaling="linear", base_batch_size=64, warmup_epochs=4, warmup_start="base",
                          decay="step", decay_boundaries={32: 0.25, 64: 0.125})
    schedule = build_schedule(cfg, 0.001, 0.004, steps_per_epoch=10, epochs=100)
    steps = np.array([0, 10, 20, 39, 40, 319, 320, 639, 640, 999])
    expected = np.where(steps < 40, 0.001 + 0.003 * steps / 40, 0.004)
    expected = np.where(steps >= 320, 0.001, expected)
    expected = np.where(steps >= 640, 0.0005, expected)
    np.testing.assert_allclose(values(schedule, steps), expected, rtol=1e-6)


def test_cosine_and_polynomial_after_warmup():
    steps = np.arange(0, 120, 7)
    cosine = WarmupDecay(1.0, steps_per_epoch=10, warmup_steps=20, decay="cosine", decay_steps=100, end_factor=0.1)
    progress = np.clip((steps - 20) / 100, 0, 1)
    expected = np.where(steps < 20, steps / 20, 0.1 + 0.9 * 0.5 * (1 + np.cos(math.pi * progress)))
    np.testing.assert_allclose(values(cosine, steps), expected, rtol=1e-5, atol=1e-7)

    poly = WarmupDecay(2.0, steps_per_epoch=10, warmup_steps=0, decay="polynomial", decay_steps=50, power=2.0)
    expected = 2.0 * (1 - np.clip(steps / 50, 0, 1)) ** 2
    np.testing.assert_allclose(values(poly, steps), expected, rtol=1e-5, atol=1e-7)


def test_schedule_serialises():
    schedule = WarmupDecay(0.5, 7, warmup_steps=3, decay="step", decay_boundaries={2: 0.1})
    clone = WarmupDecay.from_config(schedule.get_config())
    np.testing.assert_allclose(values(clone, range(30)), values(schedule, range(30)))
    with pytest.raises(ValueError, match="decay_steps"):
        WarmupDecay(1.0, 10, decay="cosine")
