"""distlab: the package behind the course on distributed training."""

__version__ = "0.1.0"
