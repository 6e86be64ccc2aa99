"""Where a training step's time goes, layer by layer: ``python -m common.tools.bench --config C --per-layer``.

Measured by timing each layer alone on its real input: one training batch is run through the network (in
training mode, layer by layer, as Keras' functional graph runs it) and every layer call's inputs are kept; each
call is then timed as a ``tf.function`` of its own, forward alone and forward with backward (a GradientTape
over the layer's trainable weights and, except where the input is the network's own, its input: what the real
step differentiates), the fastest of several runs after warm-up runs (as ``timeit`` takes it: what else runs on
the machine only adds time), less the time of a call that does nothing
on the same inputs (the step pays no call per layer).  Backward = (forward + backward) - forward.
Outside the layers: the optimizer's update alone (``optimizer.apply`` on gradients of the weights' shapes), the
gradients' allreduce alone (``Distributed.allreduce_gradients``, nothing on one rank), and the input pipeline's
share (the bench's end-to-end step less its compute step).  What is left of the measured compute step is the
loss, the metrics, Keras' step and what the layers lose or gain beside each other (caches, layouts reordered
between ops, threads): ``outside``.

Timed alone, a layer may find its input in another memory layout or cache than in the step, runs without the
ops beside it that the step overlaps with it, and its call's own cost is estimated, not absent: the parts do not
add up to the step exactly, and the account states their sum beside the measured step.

FLOPs follow ``common.nn.flops`` (2 per multiply-add, only convolutions and dense layers counted); backward is
twice the forward, or once for a layer whose input is the network's input (no input gradient is computed).  A
nested model (a backbone) is one row.
"""

from __future__ import annotations

import dataclasses
import time

import keras
import tensorflow as tf

from common.nn.flops import forward_flops_per_sample, layer_multiply_adds

METHOD = ("each layer timed alone on its real input (a training batch through the network), as a tf.function, "
          "the fastest of {repeats} runs after {warmup} warm-up runs, less an empty call's time; "
          "backward = (forward + backward) - forward")


@dataclasses.dataclass
class LayerCall:
    """One call of a layer in the network's graph, with the values it was called on."""

    layer: keras.layers.Layer
    args: tuple
    kwargs: dict
    outputs: list
    reads_network_input: bool

    @property
    def tensors(self) -> list:
        return [t for t in tf.nest.flatten((self.args, self.kwargs)) if tf.is_tensor(t)]

    def call(self, tensors):
        """The layer called with ``tensors`` in place of the recorded ones (everything else as recorded)."""
        flat = tf.nest.flatten((self.args, self.kwargs))
        replacements = iter(tensors)
        flat = [next(replacements) if tf.is_tensor(t) else t for t in flat]
        args, kwargs = tf.nest.pack_sequence_as((self.args, self.kwargs), flat)
        return self.layer(*args, **kwargs)


def layer_calls(network: keras.Model, inputs) -> list[LayerCall]:
    """Every layer call of a functional ``network`` on ``inputs`` in training mode, in the order Keras runs them."""
    calls: list[LayerCall] = []
    network_inputs = {id(t) for t in tf.nest.flatten(inputs)}

    def operation_fn(layer):
        def call(*args, **kwargs):
            if "training" in getattr(layer, "_call_context_args", ()):
                kwargs["training"] = True
            outputs = layer(*args, **kwargs)
            tensors = [t for t in tf.nest.flatten((args, kwargs)) if tf.is_tensor(t)]
            calls.append(LayerCall(layer, args, kwargs, tf.nest.flatten(outputs),
                                   any(id(t) in network_inputs for t in tensors)))
            return outputs
        return call

    # Keras' own walk of a functional graph (keras/src/ops/function.py): each node's arguments filled in with
    # the values computed so far, its operation called through ``operation_fn``.
    network._run_through_graph(inputs, operation_fn=operation_fn)
    return calls


def forward_flops(call: LayerCall) -> int:
    """Forward FLOPs of the call for its whole batch."""
    batch = int(call.outputs[0].shape[0])
    if isinstance(call.layer, keras.Model):
        return forward_flops_per_sample(call.layer) * batch
    return 2 * layer_multiply_adds(call.layer, tuple(call.tensors[0].shape), tuple(call.outputs[0].shape)) * batch


def fastest_seconds(function, arguments, repeats: int, warmup: int) -> float:
    """The shortest wall time of ``function(*arguments)`` over ``repeats`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        _materialise(function(*arguments))
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        _materialise(function(*arguments))
        times.append(time.perf_counter() - started)
    return min(times)


def _materialise(result) -> None:
    """Wait for ``result``: its first tensor read back (a device other than the CPU may still be computing when
    the call returns; on the CPU the call has finished)."""
    first = next((t for t in tf.nest.flatten(result) if tf.is_tensor(t)), None)
    if first is not None:
        tf.reshape(first, [-1])[:1].numpy()


def call_overhead(tensors, repeats: int, warmup: int) -> float:
    """Seconds a ``tf.function`` call on ``tensors`` costs doing nothing: subtracted from a layer's timings, which
    the step does not pay per layer (on a CPU some tens of microseconds: a tiny network's whole layer)."""
    nothing = tf.function(lambda *inputs: tf.constant(0.0), reduce_retracing=True)
    return fastest_seconds(nothing, tensors, repeats, warmup)


def time_call(call: LayerCall, repeats: int, warmup: int) -> tuple[float, float]:
    """(forward, backward) seconds of one layer call on its recorded inputs, a call's own cost left out."""
    tensors = call.tensors
    weights = list(call.layer.trainable_variables)
    # The real step differentiates every floating input but the network's own (the data need no gradient).
    watched = [] if call.reads_network_input else [i for i, t in enumerate(tensors) if t.dtype.is_floating]
    cotangents = [tf.random.stateless_normal(o.shape, seed=[1, i], dtype=o.dtype) if o.dtype.is_floating else None
                  for i, o in enumerate(call.outputs)]

    @tf.function(jit_compile=False, reduce_retracing=True)
    def forward(*inputs):
        return call.call(list(inputs))

    @tf.function(jit_compile=False, reduce_retracing=True)
    def forward_backward(*inputs):
        with tf.GradientTape() as tape:
            for i in watched:
                tape.watch(inputs[i])
            outputs = tf.nest.flatten(call.call(list(inputs)))
            loss = tf.add_n([tf.reduce_sum(tf.cast(o * c, tf.float32)) for o, c in zip(outputs, cotangents)
                             if c is not None])
        sources = weights + [inputs[i] for i in watched]
        gradients = [g for g in tape.gradient(loss, sources) if g is not None] if sources else []
        return [loss, *gradients]

    overhead_s = call_overhead(tensors, repeats, warmup)
    forward_s = max(fastest_seconds(forward, tensors, repeats, warmup) - overhead_s, 0.0)
    differentiable = (weights or watched) and any(c is not None for c in cotangents)
    both_s = (max(fastest_seconds(forward_backward, tensors, repeats, warmup) - overhead_s, 0.0) if differentiable
              else forward_s)
    return forward_s, max(both_s - forward_s, 0.0)


def time_update(model, dist, repeats: int, warmup: int) -> tuple[float, float]:
    """(the gradients' allreduce, the optimizer's update) seconds, each alone, on gradients of the weights' shapes
    (small values: the update changes the weights of the bench's throwaway network only)."""
    variables = model.trainable_variables
    gradients = [tf.random.stateless_normal(v.shape, seed=[2, i], dtype=v.dtype) * 1e-6
                 for i, v in enumerate(variables)]
    allreduce = tf.function(lambda *g: dist.allreduce_gradients(list(g)))
    allreduce_s = fastest_seconds(allreduce, gradients, repeats, warmup) if dist.size > 1 else 0.0

    @tf.function
    def update(*g):
        model.optimizer.apply(list(g), variables)
        return tf.constant(0.0)

    return allreduce_s, fastest_seconds(update, gradients, repeats, warmup)


def account(network: keras.Model, model, dist, batch_inputs, step_s: float, end_to_end_step_s: float,
            peak_flops: float | None, repeats: int = 5, warmup: int = 2) -> dict:
    """The per-layer account of one rank's training step (``step_s``: the bench's measured compute step;
    ``end_to_end_step_s``: its step with the input pipeline; ``peak_flops``: this rank's peak at the run's
    precision)."""
    rows = []
    for call in layer_calls(network, batch_inputs):
        if isinstance(call.layer, keras.layers.InputLayer):
            continue
        forward_s, backward_s = time_call(call, repeats, warmup)
        flops = forward_flops(call)
        backward_flops = flops if call.reads_network_input else 2 * flops
        rows.append({
            "layer": call.layer.name, "kind": type(call.layer).__name__,
            "input_shape": list(call.tensors[0].shape) if call.tensors else [],
            "output_shape": list(call.outputs[0].shape),
            "forward_ms": 1e3 * forward_s, "backward_ms": 1e3 * backward_s,
            "forward_flops": flops, "backward_flops": backward_flops,
            "forward_ratio_to_peak": flops / forward_s / peak_flops if peak_flops and flops and forward_s else None,
            "backward_ratio_to_peak": (backward_flops / backward_s / peak_flops
                                       if peak_flops and flops and backward_s else None)})
        row = rows[-1]
        # A ratio above 1 is no rate above the ceiling: a time too short to split from the call's own cost, or a
        # matmul probe reading below what oneDNN's convolution kernels reach (seen at 128^3: 1.07 in fp32, 1.24 in
        # bf16 on an AMD EPYC).  Flagged, never shown as an achievement.
        row["beyond_resolution"] = any(ratio is not None and ratio > 1.0
                                       for ratio in (row["forward_ratio_to_peak"], row["backward_ratio_to_peak"]))
    allreduce_s, optimizer_s = time_update(model, dist, repeats, warmup)
    layers_ms = sum(row["forward_ms"] + row["backward_ms"] for row in rows)
    step_ms = 1e3 * step_s
    parts_ms = layers_ms + 1e3 * (allreduce_s + optimizer_s)
    return {
        "method": METHOD.format(repeats=repeats, warmup=warmup),
        "step_ms": step_ms,
        "end_to_end_step_ms": 1e3 * end_to_end_step_s,
        "layers": rows,
        "layers_ms": layers_ms,
        "optimizer_ms": 1e3 * optimizer_s,
        "allreduce_ms": 1e3 * allreduce_s,
        "input_ms": max(1e3 * (end_to_end_step_s - step_s), 0.0),
        "outside_ms": step_ms - parts_ms,
        "parts_over_step": parts_ms / step_ms,
        # The parts timed alone taking longer than the step: what the step overlaps, fuses or keeps in cache and the
        # layers alone do not (or a machine busier while they were timed); then there is no time left outside.
        "parts_exceed_step": parts_ms > step_ms,
        "peak_flops": peak_flops,
    }


def account_table(result: dict) -> str:
    """The account as the bench prints it: a row per layer, then what is outside the layers."""
    step = result["step_ms"]
    ratio = lambda value: f"{value:5.2f}" if value is not None else "    -"  # noqa: E731
    lines = [f"  per layer ({result['method']})",
             f"    {'layer':<28} {'kind':<20} {'fwd ms':>9} {'bwd ms':>9} {'GFLOP':>8} {'fwd/pk':>6} {'bwd/pk':>6} "
             f"{'share':>6}"]
    for row in result["layers"]:
        share = (row["forward_ms"] + row["backward_ms"]) / step
        lines.append(f"    {row['layer'][:28]:<28} {row['kind'][:20]:<20} {row['forward_ms']:9.2f} "
                     f"{row['backward_ms']:9.2f} {(row['forward_flops'] + row['backward_flops']) / 1e9:8.2f} "
                     f"{ratio(row['forward_ratio_to_peak'])}  {ratio(row['backward_ratio_to_peak'])} {share:6.1%}"
                     + (" *" if row["beyond_resolution"] else ""))
    for name in ("layers", "optimizer", "allreduce"):
        lines.append(f"    {name:<49} {result[f'{name}_ms']:9.2f} ms {result[f'{name}_ms'] / step:6.1%}")
    if result["parts_exceed_step"]:
        lines.append(f"    {'outside (loss, metrics, the step itself)':<49}         - (the parts exceed the step)")
    else:
        lines.append(f"    {'outside (loss, metrics, the step itself)':<49} {result['outside_ms']:9.2f} ms "
                     f"{result['outside_ms'] / step:6.1%}")
    lines.append(f"    measured compute step {step:.2f} ms: the parts timed alone sum to "
                 f"{result['parts_over_step']:.0%} of it; input pipeline adds {result['input_ms']:.2f} ms end to end")
    if any(row["beyond_resolution"] for row in result["layers"]):
        lines.append("    * above the same-run matmul peak: not a rate above the ceiling, but a time too short to tell from a "
                     "call's own cost, or a matmul probe reading below what the convolution kernels reach")
    if result["parts_exceed_step"]:
        lines.append("    the layers alone take longer than in the step: what it overlaps, fuses or keeps in cache "
                     "(or a busier machine while they were timed); read their shares, not a remainder")
    return "\n".join(lines)
