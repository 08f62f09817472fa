"""Takes the mean (the uniform attention weights' output) for both ends."""


def reachable_range(values):
    mean = values.mean(0)
    return mean, mean
