"""What runs around each training step and epoch: the callbacks (epoch-end synchronisation, checkpoints, throughput),
the step guard and watchdog, stop requests by signal, MLPerf logging.
"""
