"""A run's records: the files it writes, and the loggers that carry its metrics elsewhere.

``run_files`` names every file of a run directory and writes them atomically (a crash or kill never leaves half a
file); ``recorder`` appends a run's metrics and samples and hands them to the configured logger; ``loggers`` is the
logger registry (``logger.name``), ``wandb_logger`` the W&B one (runs, groups, the step axis, re-evaluations). It
imports only ``agon.core``: what is recorded is handed to it as plain values.
"""
