from lumen.config import ACTIVATIONS

gelu = ACTIVATIONS["gelu"]
