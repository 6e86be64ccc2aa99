"""Tiramisu (FC-DenseNet, Jegou et al. 2017), the climate variant of Kurth et al., SC18.

    first conv (first_filters, k x k)
    down:  per block of n layers: dense block -> keep as skip -> transition down
    bottleneck: dense block of ``bottleneck_layers``; only its new maps go up
    up:    per block: transition up (3x3 transposed conv, stride 2, over the
           previous block's new maps) -> concat skip -> dense block
    1x1 conv to the classes (float32 logits)

A dense-block layer is [BatchNorm] -> ReLU -> Conv(growth_rate, k x k) ->
Dropout, its output concatenated to the block's input.  Transition down is
[BatchNorm] -> ReLU -> 1x1 conv (as many filters as it gets), stride 2 ->
Dropout.  SC18: growth 32, 5x5 kernels, blocks [2, 2, 2, 4] / 5 / [4, 2, 2, 2],
first conv 64, dropout 0.2; the input is 768 x 1152 x 16 and the bottleneck
runs at 1/16 of it (48 x 72).  Heights and widths must divide by
2 ** len(down_blocks).
"""

from __future__ import annotations

import keras
from keras import layers

from climate_seg.segmentation.config import TiramisuSection
from common.nn.layers import ByteDropout, FusedBatchNormalization


class _Builder:
    def __init__(self, cfg: TiramisuSection, weight_decay: float):
        self.cfg = cfg
        self.regularizer = keras.regularizers.L2(weight_decay) if weight_decay > 0 else None

    def conv(self, x, filters, kernel, name, strides=1):
        return layers.Conv2D(filters, kernel, strides=strides, padding="same", kernel_initializer="he_uniform",
                             kernel_regularizer=self.regularizer, name=name)(x)

    def preact(self, x, name):
        if self.cfg.batch_norm:
            x = FusedBatchNormalization(name=f"{name}_bn")(x)
        return layers.ReLU(name=f"{name}_relu")(x)

    def dropout(self, x, name):
        return ByteDropout(self.cfg.dropout, name=f"{name}_dropout")(x) if self.cfg.dropout else x

    def dense_block(self, x, n_layers: int, name: str):
        """(block input + new maps, the new maps alone)."""
        new_maps = []
        for i in range(n_layers):
            y = self.preact(x, f"{name}_l{i}")
            y = self.conv(y, self.cfg.growth_rate, self.cfg.kernel_size, f"{name}_l{i}_conv")
            y = self.dropout(y, f"{name}_l{i}")
            new_maps.append(y)
            x = layers.Concatenate(name=f"{name}_l{i}_concat")([x, y])
        fresh = new_maps[0] if len(new_maps) == 1 else layers.Concatenate(name=f"{name}_new")(new_maps)
        return x, fresh

    def transition_down(self, x, name):
        filters = x.shape[-1]
        x = self.preact(x, name)
        x = self.conv(x, filters, 1, f"{name}_conv", strides=2)
        return self.dropout(x, name)

    def transition_up(self, x, filters, name):
        return layers.Conv2DTranspose(filters, 3, strides=2, padding="same", kernel_initializer="he_uniform",
                                      kernel_regularizer=self.regularizer, name=f"{name}_deconv")(x)


def build_tiramisu(cfg: TiramisuSection, input_shape: tuple[int, int, int], n_classes: int,
                   weight_decay: float = 0.0) -> keras.Model:
    depth = 2 ** len(cfg.down_blocks)
    if input_shape[0] % depth or input_shape[1] % depth:
        raise ValueError(f"tiramisu: input {input_shape[:2]} must divide by {depth} (2 ** len(down_blocks)); "
                         "change data.crop or data.downsample")
    b = _Builder(cfg, weight_decay)
    inputs = keras.Input(shape=input_shape, name="fields")
    x = b.conv(inputs, cfg.first_filters, cfg.kernel_size, "first_conv")
    skips = []
    for i, n_layers in enumerate(cfg.down_blocks):
        x, _ = b.dense_block(x, n_layers, f"down{i}")
        skips.append(x)
        x = b.transition_down(x, f"td{i}")
    _, fresh = b.dense_block(x, cfg.bottleneck_layers, "bottleneck")
    previous_layers = cfg.bottleneck_layers
    for i, n_layers in enumerate(cfg.up_blocks):
        x = b.transition_up(fresh, cfg.growth_rate * previous_layers, f"tu{i}")
        x = layers.Concatenate(name=f"up{i}_skip")([x, skips[-1 - i]])
        x, fresh = b.dense_block(x, n_layers, f"up{i}")
        previous_layers = n_layers
    logits = layers.Conv2D(n_classes, 1, kernel_initializer="he_uniform", kernel_regularizer=b.regularizer,
                           dtype="float32", name="logits")(x)
    return keras.Model(inputs, logits, name="tiramisu")
