"""Punctuation: the model, the generators that make it, and the idle and late policies."""

from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS, Punctuation

__all__ = ["END_OF_STREAM", "NO_PROGRESS", "Punctuation"]
