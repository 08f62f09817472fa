"""Reduces over the coordinates instead of over the tokens."""


def reachable_range(values):
    return values.min(-1).values, values.max(-1).values
