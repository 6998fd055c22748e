"""The ``neuron-compile`` command line (also ``python -m neuron_compile``).

Sub-commands live next to what they manage and register themselves here through
:data:`SUBCOMMANDS`: each entry is ``(name, help, add_arguments, run)``. ``main(argv)`` returns the
exit status: 0 ok, 1 error, 2 usage.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

# name -> module implementing `add_arguments(parser)` and `run(args) -> int`.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "cache": ("neuron_compile.cache.cli", "inspect and manage the compiled-artifact cache"),
    "ops": ("neuron_compile.support_matrix", "list the supported ATen ops and dtypes"),
    "check": ("neuron_compile.evaluate_cli", "run a script in fallback + numeric-check mode; print a readiness report"),
    "explain": ("neuron_compile.explain", "run a script; per graph and kernel: estimated vs roofline time, fusion"),
    "precompile": ("neuron_compile.precompile", "capture a script's graphs (no kernel runs), compile them in "
                   "parallel into the cache"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="neuron-compile", description="neuron-compile: torch.compile for Trainium")
    parser.add_argument("--cache-dir", metavar="DIR", default=argparse.SUPPRESS,
                        help="cache root for this command and the scripts it runs (sets NEURON_COMPILE_CACHE_DIR)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        try:
            mod = importlib.import_module(module)
        except ImportError:  # a sub-command not built yet in this checkout
            continue
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    if not getattr(args, "_run", None):
        parser.print_help(sys.stderr)
        return 2
    if getattr(args, "cache_dir", None):  # also for scripts run by check/explain/precompile (child processes too)
        os.environ["NEURON_COMPILE_CACHE_DIR"] = os.path.abspath(os.path.expanduser(args.cache_dir))
    from neuron_compile.errors import ConfigError

    try:
        return int(args._run(args))
    except ConfigError as exc:  # a bad NEURON_COMPILE_* setting or option value: say which, no traceback
        print(f"neuron-compile {args.command}: error: {exc}", file=sys.stderr)
        return 1
