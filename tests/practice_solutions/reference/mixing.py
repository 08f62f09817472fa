"""lumen's attention is a convex combination of the values: its reachable range per coordinate."""


def reachable_range(values):
    return values.min(0).values, values.max(0).values
