"""chaosbench: chaos-testing and recovery benchmark harness for multi-rank PyTorch training."""

__version__ = "0.1.0"
