"""The bench's per-layer account (common/tools/layer_account.py): every layer call of the graph found with its real
inputs, FLOPs against counts written out by hand, and the parts of the step adding up as the account says."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from common import distributed
from common.tools import layer_account


def tiny_network():
    """A 4x4x2 input through a 3x3 convolution and a 1x1 branch added to it, then a dense layer of 5."""
    inputs = keras.Input((4, 4, 2), name="x")
    wide = keras.layers.Conv2D(3, 3, padding="same", name="wide")(inputs)
    narrow = keras.layers.Conv2D(3, 1, name="narrow")(inputs)
    added = keras.layers.Add(name="added")([wide, narrow])
    normed = keras.layers.BatchNormalization(name="normed")(added)
    flat = keras.layers.Flatten(name="flat")(normed)
    outputs = keras.layers.Dense(5, name="dense")(flat)
    return keras.Model(inputs, outputs)


def test_every_call_is_found_with_its_inputs_and_its_flops_are_counted_by_hand():
    network = tiny_network()
    batch = tf.random.stateless_normal((2, 4, 4, 2), seed=[0, 1])
    calls = [call for call in layer_account.layer_calls(network, batch)
             if not isinstance(call.layer, keras.layers.InputLayer)]
    names = [call.layer.name for call in calls]
    assert sorted(names) == ["added", "dense", "flat", "narrow", "normed", "wide"]
    assert names.index("added") > max(names.index("wide"), names.index("narrow")) and names[-1] == "dense"
    by_name = {call.layer.name: call for call in calls}
    assert by_name["wide"].reads_network_input and by_name["narrow"].reads_network_input
    assert not by_name["dense"].reads_network_input
    assert [tuple(t.shape) for t in by_name["added"].tensors] == [(2, 4, 4, 3), (2, 4, 4, 3)]
    # The recorded inputs are the values the network computes: the dense layer on them gives the network's output
    # (batch norm in training mode, as recorded: the same batch statistics).
    np.testing.assert_allclose(by_name["dense"].outputs[0], network(batch, training=True), rtol=1e-5, atol=1e-6)
    # Multiply-adds per sample: 16 positions x 9 taps x 2 x 3 channels; 16 x 2 x 3; 48 x 5.  Two samples, 2 FLOP each.
    flops = {name: layer_account.forward_flops(call) for name, call in by_name.items()}
    assert flops == {"wide": 2 * 2 * 864, "narrow": 2 * 2 * 96, "dense": 2 * 2 * 240, "added": 0, "normed": 0,
                     "flat": 0}


def test_the_account_of_a_step_adds_up_and_counts_backward_flops_by_the_convention():
    network = tiny_network()
    network.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    network.optimizer.build(network.trainable_variables)
    dist = distributed.init()
    batch = tf.random.stateless_normal((2, 4, 4, 2), seed=[0, 1])
    result = layer_account.account(network, network, dist, batch, step_s=0.01, end_to_end_step_s=0.012,
                                   peak_flops=1e9, repeats=3, warmup=1)
    rows = {row["layer"]: row for row in result["layers"]}
    assert set(rows) == {"wide", "narrow", "added", "normed", "flat", "dense"}
    # backward: the weight gradient alone (1 x forward) where the input is the network's, 2 x elsewhere
    assert rows["wide"]["backward_flops"] == rows["wide"]["forward_flops"] == 2 * 2 * 864
    assert rows["dense"]["backward_flops"] == 2 * rows["dense"]["forward_flops"]
    assert rows["added"]["forward_ratio_to_peak"] is None   # no FLOPs counted, no ratio
    for row in rows.values():
        assert row["forward_ms"] >= 0 and row["backward_ms"] >= 0
        if row["forward_ratio_to_peak"] is not None and row["forward_ms"] > 0:
            assert row["forward_ratio_to_peak"] == pytest.approx(row["forward_flops"] / (row["forward_ms"] / 1e3) / 1e9)
    assert result["layers_ms"] == pytest.approx(sum(r["forward_ms"] + r["backward_ms"] for r in rows.values()))
    assert result["optimizer_ms"] > 0 and result["allreduce_ms"] == 0.0   # one rank: nothing to reduce
    assert result["step_ms"] == pytest.approx(10.0) and result["input_ms"] == pytest.approx(2.0)
    parts = result["layers_ms"] + result["optimizer_ms"] + result["allreduce_ms"]
    assert result["parts_over_step"] == pytest.approx(parts / 10.0)
    assert result["outside_ms"] == pytest.approx(10.0 - parts)
    assert result["parts_exceed_step"] == (parts > 10.0)
    for row in rows.values():
        ratios = [r for r in (row["forward_ratio_to_peak"], row["backward_ratio_to_peak"]) if r is not None]
        assert row["beyond_resolution"] == any(r > 1.0 for r in ratios)
    table = layer_account.account_table(result)
    assert all(name in table for name in rows) and "measured compute step 10.00 ms" in table
    # A step shorter than its parts: no negative remainder printed, the reason said; a ratio above 1 starred.
    short = {**result, "step_ms": parts / 2, "outside_ms": -parts / 2, "parts_over_step": 2.0,
             "parts_exceed_step": True,
             "layers": [{**result["layers"][0], "forward_ratio_to_peak": 3.0, "beyond_resolution": True}]}
    table = layer_account.account_table(short)
    assert "(the parts exceed the step)" in table and "-" + f"{parts / 2:.2f}" not in table
    assert "* above the same-run matmul peak" in table and table.splitlines()[2].endswith(" *")
