"""Code generation: kernel IR -> NKI kernel source via Jinja2 templates (``neuron_compile.codegen``)."""
