"""selfplay: train language models by multi-agent self-play."""

__version__ = "0.1.0"
