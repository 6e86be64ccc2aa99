"""Command-line tools beside the library (``python -m common.tools.<name>``): ``bench`` (throughput), ``scaling``
(the scaling model), ``slurm`` (what the SLURM scripts ask of a config), ``check_data`` (a data folder screened),
``build_info`` (what TensorFlow and Horovod were built with: the GPU build's line).
"""
