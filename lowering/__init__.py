"""Lowering: ATen FX graphs -> kernel IR (installed as ``neuron_compile.lowering``)."""
