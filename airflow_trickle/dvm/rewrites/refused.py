"""The one error a rewrite raises."""
from __future__ import annotations


class SubqueryRefused(ValueError):
    """A construct a rewrite cannot turn into one of the same meaning; the message names it."""
