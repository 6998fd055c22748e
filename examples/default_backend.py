"""Make "neuron" the default torch.compile backend, then compile with plain ``torch.compile(model)``.

``torch.compiler.set_default_backend`` does not check the name it is given: a typo such as
``"nuron"`` is accepted there and only fails at the next ``torch.compile``. The name that works is
``"neuron"`` (registered by the package's ``torch_dynamo_backends`` entry point, so no import of
``neuron_compile`` is needed). ``dynamic=False`` is still worth passing: without it the backend
compiles one static graph per new input shape anyway (it never compiles a symbolic graph).
Run: ``python examples/default_backend.py`` (exit status 1 if the result differs from eager).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from models import MLP  # noqa: E402

BACKEND = "neuron"  # the registered name; set_default_backend would accept a misspelling silently


def main() -> int:
    torch.compiler.set_default_backend(BACKEND)
    print(f"torch.compiler.set_default_backend({BACKEND!r})")

    torch.manual_seed(0)
    model = MLP(d_in=96, d_hidden=200, d_out=10).eval()
    compiled = torch.compile(model)  # no backend= argument: uses the default set above
    ok = True
    for batch in (4, 7):  # a second shape: a second static compile, not a symbolic graph
        x = torch.randn(batch, 96)
        with torch.no_grad():
            expected, got = model(x), compiled(x)
        err = (got - expected).abs().max().item()
        match = torch.allclose(got, expected, atol=1e-4, rtol=1e-4)
        ok &= match
        print(f"batch {batch}: max abs error vs eager {err:.3e}: {'ok' if match else 'MISMATCH'}")

    from neuron_compile.backend import compiled_graphs  # imported late: the entry point did the registration

    kinds = [g["kind"] for g in compiled_graphs()]
    print(f"graphs compiled by backend {BACKEND!r}: {len(kinds)} ({', '.join(kinds)})")
    ok &= len(kinds) == 2
    print("MATCH" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
