"""Content-addressed cache of compiled artifacts (installed as ``neuron_compile.cache``)."""
