"""The bottom layer: what a run is, as definitions every other layer reads.

The config schemas (``config``: dataclasses stored in Hydra's ConfigStore), the base of every registry
(``registry``), the algorithm as pure tensor functions (``grpo``: advantages, losses, the sampler correction;
``scoring``: per-token log-probabilities from hidden states without a ``[b, T, V]`` tensor), the reward modes
(``rewards``), what a method is (``methods``: its adapters, turns and evaluation) and the ranks of a multi-process
run (``distributed``). It imports nothing of agon above it: no task, no model, no engine, no file on disk.
"""
