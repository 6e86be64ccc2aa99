"""DeepLabv3+ (Chen et al. 2018) on a ResNet-50 v2 backbone, the climate variant of Kurth et al., SC18.

Backbone, built from scratch for 16 input channels: 7x7/2 stem conv and 3x3/2
max pool (1/4), then four stages of pre-activation bottleneck units
(BN -> ReLU -> 1x1 -> BN -> ReLU -> 3x3 -> BN -> ReLU -> 1x1 x4, projection
shortcut from the pre-activation when the shape changes; biases where
keras.applications.ResNet50V2 has them, so the parameter counts agree) with widths 64, 128,
256, 512.  Stages stride by 2 until the output stride is reached; the later
ones dilate their 3x3 convs instead (output stride 8: stages 3-4 dilated 2
and 4; 16: stage 4 dilated 2).

ASPP on the backbone output: 1x1 conv, three 3x3 atrous convs (rates 12/24/36
at output stride 8, 6/12/18 at 16), image pooling (global average -> 1x1 conv
-> broadcast back), all ``aspp_filters`` wide with BN + ReLU, concatenated,
projected by a 1x1 conv, dropout.

Decoders (low-level features: stage 1's output at 1/4, reduced to 48 maps):

- ``bilinear`` (the paper): ASPP output bilinearly up to 1/4, concat the
  low-level maps, two 3x3 convs, 1x1 to the classes, bilinear x4.
- ``deconv``: the same with learned transposed convs in place of both
  bilinear upsamplings.
- ``deconv1x`` (SC18): transposed convs to 1/4, concat the low-level maps,
  two 3x3 convs, then two stride-2 transposed convs back to full resolution,
  concat the input fields (a full-resolution skip), a 3x3 conv, 1x1 to the
  classes.

Logits are float32 under any precision policy.  Heights and widths must divide
by the output stride.
"""

from __future__ import annotations

import keras
from keras import layers

from climate_seg.segmentation.config import DeeplabSection
from common.nn.layers import ByteDropout, DilatedConv2D, FusedBatchNormalization

STEM_STRIDE = 4


class _Builder:
    def __init__(self, weight_decay: float):
        self.regularizer = keras.regularizers.L2(weight_decay) if weight_decay > 0 else None

    def conv(self, x, filters, kernel, name, strides=1, dilation=1, use_bias=False):
        conv = DilatedConv2D if dilation > 1 else layers.Conv2D
        return conv(filters, kernel, strides=strides, dilation_rate=dilation, padding="same", use_bias=use_bias,
                    kernel_initializer="he_uniform", kernel_regularizer=self.regularizer, name=name)(x)

    def deconv(self, x, filters, strides, name):
        return layers.Conv2DTranspose(filters, 2 * strides, strides=strides, padding="same", use_bias=False,
                                      kernel_initializer="he_uniform", kernel_regularizer=self.regularizer,
                                      name=name)(x)

    @staticmethod
    def bn_relu(x, name):
        x = FusedBatchNormalization(name=f"{name}_bn")(x)
        return layers.ReLU(name=f"{name}_relu")(x)

    def conv_bn_relu(self, x, filters, kernel, name, dilation=1):
        return self.bn_relu(self.conv(x, filters, kernel, name, dilation=dilation), name)

    def bottleneck(self, x, filters, stride, dilation, name):
        preact = self.bn_relu(x, f"{name}_preact")
        if stride != 1 or x.shape[-1] != 4 * filters:
            shortcut = self.conv(preact, 4 * filters, 1, f"{name}_shortcut", strides=stride, use_bias=True)
        else:
            shortcut = x
        y = self.conv_bn_relu(preact, filters, 1, f"{name}_1")
        y = self.bn_relu(self.conv(y, filters, 3, f"{name}_2", strides=stride, dilation=dilation), f"{name}_2")
        y = self.conv(y, 4 * filters, 1, f"{name}_3", use_bias=True)
        return layers.Add(name=f"{name}_add")([shortcut, y])


def resnet50_v2(b: _Builder, inputs, cfg: DeeplabSection):
    """(backbone output at 1/output_stride, stage-1 output at 1/4)."""
    x = b.conv(inputs, cfg.base_filters, 7, "stem_conv", strides=2, use_bias=True)
    x = layers.MaxPooling2D(3, strides=2, padding="same", name="stem_pool")(x)
    stride, dilation, low_level = STEM_STRIDE, 1, None
    for stage, units in enumerate(cfg.blocks):
        filters = cfg.base_filters * 2 ** stage
        stage_stride = 1
        if stage > 0:
            if stride < cfg.output_stride:
                stage_stride, stride = 2, stride * 2
            else:
                dilation *= 2
        for unit in range(units):
            x = b.bottleneck(x, filters, stage_stride if unit == 0 else 1, dilation, f"stage{stage + 1}_unit{unit + 1}")
        if stage == 0:
            low_level = x
    return b.bn_relu(x, "backbone_post"), low_level


def aspp(b: _Builder, x, cfg: DeeplabSection):
    branches = [b.conv_bn_relu(x, cfg.aspp_filters, 1, "aspp_1x1")]
    for rate in cfg.rates:
        branches.append(b.conv_bn_relu(x, cfg.aspp_filters, 3, f"aspp_rate{rate}", dilation=rate))
    pooled = layers.GlobalAveragePooling2D(keepdims=True, name="aspp_image_pool")(x)
    pooled = b.conv_bn_relu(pooled, cfg.aspp_filters, 1, "aspp_pool_conv")
    branches.append(layers.UpSampling2D(size=tuple(x.shape[1:3]), name="aspp_pool_broadcast")(pooled))
    x = layers.Concatenate(name="aspp_concat")(branches)
    x = b.conv_bn_relu(x, cfg.aspp_filters, 1, "aspp_project")
    return ByteDropout(cfg.dropout, name="aspp_dropout")(x) if cfg.dropout else x


def build_deeplab(cfg: DeeplabSection, input_shape: tuple[int, int, int], n_classes: int,
                  weight_decay: float = 0.0) -> keras.Model:
    if input_shape[0] % cfg.output_stride or input_shape[1] % cfg.output_stride:
        raise ValueError(f"deeplab: input {input_shape[:2]} must divide by the output stride {cfg.output_stride}; "
                         "change data.crop or data.downsample")
    b = _Builder(weight_decay)
    inputs = keras.Input(shape=input_shape, name="fields")
    features, low_level = resnet50_v2(b, inputs, cfg)
    x = aspp(b, features, cfg)
    up = cfg.output_stride // STEM_STRIDE
    if cfg.decoder == "bilinear":
        x = layers.UpSampling2D(up, interpolation="bilinear", name="decoder_up")(x)
    else:
        x = b.bn_relu(b.deconv(x, cfg.decoder_filters, up, "decoder_up"), "decoder_up")
    low = b.conv_bn_relu(low_level, cfg.low_level_filters, 1, "low_level_reduce")
    x = layers.Concatenate(name="decoder_concat")([x, low])
    x = b.conv_bn_relu(x, cfg.decoder_filters, 3, "decoder_conv1")
    x = b.conv_bn_relu(x, cfg.decoder_filters, 3, "decoder_conv2")
    if cfg.decoder == "bilinear":
        x = b.conv(x, n_classes, 1, "decoder_classes", use_bias=True)
        logits = layers.UpSampling2D(STEM_STRIDE, interpolation="bilinear", dtype="float32", name="logits")(x)
    elif cfg.decoder == "deconv":
        x = b.conv(x, n_classes, 1, "decoder_classes", use_bias=True)
        logits = layers.Conv2DTranspose(n_classes, 2 * STEM_STRIDE, strides=STEM_STRIDE, padding="same",
                                        kernel_initializer="he_uniform", dtype="float32", name="logits")(x)
    else:  # deconv1x
        x = b.bn_relu(b.deconv(x, cfg.decoder_filters // 2, 2, "decoder_up2"), "decoder_up2")
        x = b.bn_relu(b.deconv(x, cfg.decoder_filters // 4, 2, "decoder_up1"), "decoder_up1")
        x = layers.Concatenate(name="full_resolution_skip")([x, inputs])
        x = b.conv_bn_relu(x, cfg.decoder_filters // 4, 3, "full_resolution_conv")
        logits = layers.Conv2D(n_classes, 1, kernel_initializer="he_uniform", dtype="float32", name="logits")(x)
    return keras.Model(inputs, logits, name="deeplab")
