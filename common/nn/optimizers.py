"""Optimizers: SGD/momentum and Adam from Keras, and our LARS and LARC.

LARS (layer-wise adaptive rate scaling, MLPerf form), for a variable w with
gradient g, momentum m, learning rate lr, weight decay wd::

    trust = eeta * ||w|| / (||g|| + wd * ||w|| + epsilon)   (1 when a norm is 0)
    g'    = g + wd * w
    v     = m * v + lr * trust * g'
    w    -= v                        (nesterov: w -= m * v + lr * trust * g')

Variables whose path contains a pattern of ``exclude_from_weight_decay`` get
wd = 0; those matching ``exclude_from_layer_adaptation`` (default: the same
patterns) get trust = 1.

LARC wraps any optimizer and rescales each gradient before the inner update::

    local = trust_coefficient * ||w|| / (||g|| + wd * ||w|| + epsilon)
    clip:  g *= min(local / lr, 1)        scale: g *= local

with wd the inner optimizer's weight decay (0 when it has none) and lr its
current learning rate.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from common.config import OptimizerSection, ScheduleSection


def _matches(path: str, patterns) -> bool:
    return any(p in path for p in patterns or ())


def _l2_norm(x):
    return ops.sqrt(ops.sum(ops.square(x)))


@keras.saving.register_keras_serializable(package="common")
class LARS(keras.optimizers.Optimizer):
    """Layer-wise Adaptive Rate Scaling with momentum (You et al., 2017).

    Args:
        learning_rate: float or ``LearningRateSchedule``.
        momentum: momentum coefficient m.
        weight_decay: L2 coefficient wd, added to the gradient and to the
            trust-ratio denominator (not Keras' decoupled weight decay).
        eeta: trust coefficient.
        epsilon: added to the trust-ratio denominator.
        nesterov: Nesterov momentum.
        exclude_from_weight_decay: substrings of variable paths without wd.
        exclude_from_layer_adaptation: substrings of variable paths with
            trust = 1; defaults to ``exclude_from_weight_decay``.
    """

    def __init__(self, learning_rate=0.001, momentum=0.9, weight_decay=0.0, eeta=0.001, epsilon=0.0,
                 nesterov=False, exclude_from_weight_decay=None, exclude_from_layer_adaptation=None,
                 name="lars", **kwargs):
        kwargs.pop("weight_decay", None)
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        if momentum < 0:
            raise ValueError(f"LARS momentum must be >= 0, got {momentum}")
        self.momentum = momentum
        self.lars_weight_decay = weight_decay
        self.eeta = eeta
        self.epsilon = epsilon
        self.nesterov = nesterov
        self.exclude_from_weight_decay_patterns = list(exclude_from_weight_decay or [])
        self.exclude_from_layer_adaptation_patterns = (
            list(exclude_from_layer_adaptation) if exclude_from_layer_adaptation is not None
            else list(self.exclude_from_weight_decay_patterns))

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        self.momentums = [self.add_variable_from_reference(v, "momentum") for v in var_list]
        # update_step receives raw backend variables in the TF backend; keep the
        # Keras paths, by variable index, to match the exclusion patterns.
        self._variable_paths = [v.path for v in var_list]

    def update_step(self, gradient, variable, learning_rate):
        index = self._get_variable_index(variable)
        path = self._variable_paths[index]
        dtype = variable.dtype
        lr = ops.cast(learning_rate, dtype)
        grad = ops.cast(ops.convert_to_tensor(gradient), dtype)
        momentum = self.momentums[index]

        decay = 0.0 if _matches(path, self.exclude_from_weight_decay_patterns) else self.lars_weight_decay
        if _matches(path, self.exclude_from_layer_adaptation_patterns):
            trust = ops.cast(1.0, dtype)
        else:
            w_norm = _l2_norm(variable)
            g_norm = _l2_norm(grad)
            ratio = self.eeta * w_norm / (g_norm + decay * w_norm + self.epsilon)
            trust = ops.where(ops.logical_and(w_norm > 0, g_norm > 0), ratio, ops.ones_like(ratio))
        if decay:
            grad = grad + decay * variable
        scaled_lr = lr * trust
        new_velocity = self.momentum * momentum + scaled_lr * grad
        self.assign(momentum, new_velocity)
        if self.nesterov:
            self.assign_sub(variable, self.momentum * new_velocity + scaled_lr * grad)
        else:
            self.assign_sub(variable, new_velocity)

    def get_config(self):
        config = super().get_config()
        config.update({
            "momentum": self.momentum,
            "weight_decay": self.lars_weight_decay,
            "eeta": self.eeta,
            "epsilon": self.epsilon,
            "nesterov": self.nesterov,
            "exclude_from_weight_decay": self.exclude_from_weight_decay_patterns,
            "exclude_from_layer_adaptation": self.exclude_from_layer_adaptation_patterns,
        })
        return config


@keras.saving.register_keras_serializable(package="common")
class LARC(keras.optimizers.Optimizer):
    """Layer-wise Adaptive Rate Control around any optimizer (clip or scale).

    Args:
        inner_optimizer: the optimizer that applies the rescaled gradients;
            its learning rate (and schedule) and iterations are the ones used.
        trust_coefficient: eta in the local learning rate.
        clip: True: ``g *= min(local / lr, 1)``; False: ``g *= local``.
        epsilon: added to the denominator.
    """

    def __init__(self, inner_optimizer, trust_coefficient=0.002, clip=True, epsilon=1e-8, name="larc", **kwargs):
        if kwargs:
            raise ValueError(f"LARC does not take {sorted(kwargs)}; set them on the inner optimizer")
        super().__init__(learning_rate=0.0, name=name)
        self.inner_optimizer = inner_optimizer
        self.trust_coefficient = trust_coefficient
        self.clip = clip
        self.epsilon = epsilon

    def build(self, var_list):
        if self.built:
            return
        self.inner_optimizer.build(var_list)
        super().build(var_list)

    @property
    def variables(self):
        return self._variables + self.inner_optimizer.variables

    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate):
        self.inner_optimizer.learning_rate = learning_rate

    @property
    def iterations(self):
        return self.inner_optimizer.iterations

    def _inner_weight_decay(self) -> float:
        return float(getattr(self.inner_optimizer, "lars_weight_decay", None)
                     or self.inner_optimizer.weight_decay or 0.0)

    def rescale_gradients(self, grads, trainable_variables):
        """The LARC gradients (before the inner optimizer sees them)."""
        decay = self._inner_weight_decay()
        lr = ops.cast(self.inner_optimizer.learning_rate, "float32")
        out = []
        for grad, variable in zip(grads, trainable_variables):
            if grad is None:
                out.append(None)
                continue
            grad = ops.convert_to_tensor(grad)
            w = ops.cast(variable, "float32")
            g = ops.cast(grad, "float32")
            w_norm = _l2_norm(w)
            g_norm = _l2_norm(g)
            local = self.trust_coefficient * w_norm / (g_norm + decay * w_norm + self.epsilon)
            if self.clip:
                local = ops.minimum(local / lr, 1.0)
            local = ops.where(ops.logical_and(w_norm > 0, g_norm > 0), local, ops.ones_like(local))
            out.append(ops.cast(g * local, grad.dtype))
        return out

    def apply(self, grads, trainable_variables=None):
        if not self.built:
            self.build(trainable_variables)
            self.built = True
        variables = trainable_variables if trainable_variables is not None else self._trainable_variables
        self.inner_optimizer.apply(self.rescale_gradients(grads, variables), trainable_variables)

    def finalize_variable_values(self, var_list):
        self.inner_optimizer.finalize_variable_values(var_list)

    def get_config(self):
        return {
            "name": self.name,
            "inner_optimizer": keras.saving.serialize_keras_object(self.inner_optimizer),
            "trust_coefficient": self.trust_coefficient,
            "clip": self.clip,
            "epsilon": self.epsilon,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(config.pop("inner_optimizer"), custom_objects=custom_objects)
        return cls(inner, **config)


def peak_learning_rate(base_learning_rate: float, schedule: ScheduleSection, global_batch_size: int) -> float:
    """The base LR scaled by global batch / base batch (linear, sqrt or none)."""
    ratio = global_batch_size / schedule.base_batch_size
    if schedule.scaling == "linear":
        return base_learning_rate * ratio
    if schedule.scaling == "sqrt":
        return base_learning_rate * math.sqrt(ratio)
    return base_learning_rate


def build_optimizer(cfg: OptimizerSection, learning_rate, loss_scaling: bool = False) -> keras.optimizers.Optimizer:
    """The optimizer named in the config; LARC and loss scaling wrap it."""
    decay = cfg.weight_decay or None
    if cfg.name == "sgd":
        optimizer = keras.optimizers.SGD(learning_rate=learning_rate, momentum=cfg.momentum,
                                         nesterov=cfg.nesterov, weight_decay=decay)
    elif cfg.name == "adam":
        optimizer = keras.optimizers.Adam(learning_rate=learning_rate, beta_1=cfg.beta_1, beta_2=cfg.beta_2,
                                          epsilon=cfg.epsilon, weight_decay=decay)
    elif cfg.name == "lars":
        optimizer = LARS(learning_rate=learning_rate, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                         eeta=cfg.eeta, epsilon=cfg.lars_epsilon, nesterov=cfg.nesterov,
                         exclude_from_weight_decay=cfg.exclude_from_weight_decay,
                         exclude_from_layer_adaptation=cfg.exclude_from_layer_adaptation)
    else:  # the schema's Literal makes this unreachable from YAML
        raise ValueError(f"optimizer.name: unknown optimizer {cfg.name!r}")
    if decay and cfg.name != "lars":
        optimizer.exclude_from_weight_decay(var_names=cfg.exclude_from_weight_decay)
    if cfg.larc.enabled:
        optimizer = LARC(optimizer, trust_coefficient=cfg.larc.trust_coefficient,
                         clip=cfg.larc.clip, epsilon=cfg.larc.epsilon)
    if loss_scaling:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer
