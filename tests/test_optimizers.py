"""LARS and LARC against a numpy reference of the formulas in common/nn/optimizers.py."""

import keras
import numpy as np
import pytest

from common.config import OptimizerSection
from common.nn.optimizers import LARC, LARS, build_optimizer

RNG = np.random.default_rng(3)
W0 = {"kernel": RNG.standard_normal((5, 3)).astype(np.float32),
      "bias": RNG.standard_normal(3).astype(np.float32),
      "zero": np.zeros(4, np.float32)}
GRADS = [{k: RNG.standard_normal(v.shape).astype(np.float32) for k, v in W0.items()} for _ in range(4)]


def run_keras(optimizer):
    variables = [keras.Variable(v.copy(), name=k) for k, v in W0.items()]
    for grads in GRADS:
        optimizer.apply([grads[v.name] for v in variables], variables)
    return {v.name: np.asarray(v) for v in variables}


def lars_reference(lr, momentum, wd, eeta, eps, nesterov, excluded):
    out = {}
    for name, w in W0.items():
        w = w.astype(np.float64).copy()
        v = np.zeros_like(w)
        for grads in GRADS:
            g = grads[name].astype(np.float64)
            skip = name in excluded
            decay = 0.0 if skip else wd
            w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
            trust = 1.0 if skip or w_norm == 0 or g_norm == 0 else eeta * w_norm / (g_norm + decay * w_norm + eps)
            g = g + decay * w
            v = momentum * v + lr * trust * g
            w = w - (momentum * v + lr * trust * g if nesterov else v)
        out[name] = w
    return out


@pytest.mark.parametrize("nesterov", [False, True])
def test_lars_matches_numpy(nesterov):
    kwargs = dict(momentum=0.9, weight_decay=5e-4, eeta=0.02, epsilon=1e-9, nesterov=nesterov)
    got = run_keras(LARS(learning_rate=0.5, exclude_from_weight_decay=["bias"], **kwargs))
    want = lars_reference(0.5, 0.9, 5e-4, 0.02, 1e-9, nesterov, excluded={"bias"})
    for name in W0:
        np.testing.assert_allclose(got[name], want[name], rtol=2e-5, atol=1e-6, err_msg=name)
    # The excluded bias follows plain momentum SGD: it must differ from a trust-scaled update.
    assert not np.allclose(got["bias"], lars_reference(0.5, 0.9, 5e-4, 0.02, 1e-9, nesterov, set())["bias"])


def larc_reference(lr, momentum, eta, eps, clip):
    out = {}
    for name, w in W0.items():
        w = w.astype(np.float64).copy()
        velocity = np.zeros_like(w)
        for grads in GRADS:
            g = grads[name].astype(np.float64)
            w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
            if w_norm > 0 and g_norm > 0:
                local = eta * w_norm / (g_norm + eps)
                g = g * (min(local / lr, 1.0) if clip else local)
            velocity = momentum * velocity - lr * g   # Keras SGD momentum
            w = w + velocity
        out[name] = w
    return out


@pytest.mark.parametrize("clip", [True, False])
def test_larc_around_sgd_matches_numpy(clip):
    inner = keras.optimizers.SGD(learning_rate=0.3, momentum=0.8)
    got = run_keras(LARC(inner, trust_coefficient=0.01, clip=clip, epsilon=1e-8))
    want = larc_reference(0.3, 0.8, 0.01, 1e-8, clip)
    for name in W0:
        np.testing.assert_allclose(got[name], want[name], rtol=2e-5, atol=1e-6, err_msg=name)


def test_config_round_trip():
    lars = LARS(learning_rate=0.1, momentum=0.8, weight_decay=1e-4, eeta=0.002, nesterov=True,
                exclude_from_weight_decay=["bias", "batch_normalization"])
    clone = keras.optimizers.deserialize(keras.optimizers.serialize(lars))
    assert isinstance(clone, LARS) and clone.get_config() == lars.get_config()
    larc = LARC(keras.optimizers.Adam(1e-3), trust_coefficient=0.005, clip=False)
    clone = keras.optimizers.deserialize(keras.optimizers.serialize(larc))
    assert isinstance(clone, LARC) and isinstance(clone.inner_optimizer, keras.optimizers.Adam)
    assert clone.get_config()["trust_coefficient"] == 0.005 and clone.clip is False


@pytest.mark.parametrize("name", ["sgd", "adam", "lars"])
@pytest.mark.parametrize("larc", [False, True])
def test_build_optimizer_from_config_with_loss_scaling(name, larc):
    cfg = OptimizerSection(name=name, weight_decay=1e-4, larc={"enabled": larc})
    optimizer = build_optimizer(cfg, 0.01, loss_scaling=True)
    assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    assert isinstance(optimizer.inner_optimizer, LARC if larc else (LARS if name == "lars" else keras.optimizers.Optimizer))
    variables = [keras.Variable(np.ones((2, 2), np.float32), name="kernel")]
    optimizer.apply([np.full((2, 2), np.inf, np.float32)], variables)   # skipped: not finite
    np.testing.assert_array_equal(np.asarray(variables[0]), 1.0)
    optimizer.apply([np.ones((2, 2), np.float32)], variables)
    assert np.all(np.asarray(variables[0]) < 1.0)
