"""Keras building blocks and numerics: layers, batch normalisation, the mixed-precision policy, LARS/LARC and the
learning-rate schedules, pooled metrics, FLOP counting.
"""
