"""`braid trace FILE.py`: run a program file with tracing on and write (or open) its trace.

Which run is traced: the file's `main()`, if it defines one, called with no arguments with
every run traced (BRAID_TRACE=1), which must return the ProgramState to show; otherwise the
last @program the file defines whose arguments (after the state) all have defaults, run
with trace=True. The file runs as a module named `__braid_trace__`, so its
`if __name__ == "__main__":` block does not run.
"""

from __future__ import annotations

import argparse
import inspect
import os
import runpy
import sys
import tempfile
import webbrowser
from pathlib import Path


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "trace",
        help="run a program file traced; write or open its trace page",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("file", type=Path, help="a Python file defining main() or a @program")
    p.add_argument("-o", "--output", type=Path, help="write the trace here (default: open it)")
    p.add_argument("--model", help="HF model directory or GGUF file (default: SmolLM2-135M)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from braid.state import ProgramState
    from braid.trace import TRACE_ENV

    if not args.file.is_file():
        raise FileNotFoundError(f"no program file {args.file}")
    if args.model is not None or args.device != "auto" or args.dtype != "auto":
        from braid.interpreter.backend import set_default_backend
        from braid.runtime.engine.engine import Engine

        set_default_backend(Engine(model=args.model, device=args.device, dtype=args.dtype))
    path = args.file.resolve()
    sys.path.insert(0, str(path.parent))  # the file's own imports, as `python FILE` has them
    os.environ[TRACE_ENV] = "1"  # set before the file runs: a run at its top level is traced
    names = runpy.run_path(str(path), run_name="__braid_trace__")
    state = _traced_state(names, path)
    if not isinstance(state, ProgramState):
        raise ValueError(f"{path.name}: main() returned {type(state).__name__}, not a state")
    out = args.output
    if out is None:
        out = Path(tempfile.mkdtemp(prefix="braid-trace-")) / f"{path.stem}.html"
    state.trace().to_html(out)
    print(f"trace written to {out}")
    if args.output is None:
        webbrowser.open(out.resolve().as_uri())
    return 0


def _traced_state(names: dict, path: Path):
    from braid.program import Program

    main = names.get("main")
    if callable(main) and not isinstance(main, Program):
        return main()
    runnable = [
        obj
        for obj in names.values()
        if isinstance(obj, Program) and _defined_in(obj, path) and _needs_no_arguments(obj)
    ]
    if not runnable:
        raise ValueError(
            f"{path.name} defines no main() and no @program that runs without arguments: "
            "give it a main() that returns a state"
        )
    return runnable[-1].run(trace=True)


def _defined_in(p, path: Path) -> bool:
    return Path(inspect.getsourcefile(p.fn) or "").resolve() == path


def _needs_no_arguments(p) -> bool:
    params = list(p.signature.parameters.values())[1:]
    return all(
        q.default is not q.empty or q.name in p.bound or q.kind in (q.VAR_POSITIONAL, q.VAR_KEYWORD)
        for q in params
    )
