"""Arguments of the user script a CLI command runs (``neuron-compile check|precompile SCRIPT [args]``)."""

from __future__ import annotations

import argparse


def script_arguments(args: argparse.Namespace) -> list[str]:
    """The script's own arguments: a leading ``--`` is dropped, and a trailing ``--json`` (which argparse's
    REMAINDER swallows when given after the script) sets ``args.json`` instead."""
    script_args = list(args.script_args)
    if script_args and script_args[0] == "--":
        return script_args[1:]
    if script_args and script_args[-1] == "--json":
        script_args.pop()
        args.json = True
    return script_args
