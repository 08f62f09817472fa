from lumen.inspect import capture
from lumen.inspect.neurons import value_logits  # noqa: F401  (lumen's own, as the exercise asks)


def unit_activations(model, idx, layer):
    return capture(model, idx, f"blocks.{layer}.mlp_hidden")


# found with `lumen neurons smollm2 --block 22`
LAYER, UNIT, TRIGGER = 22, 543, "."
