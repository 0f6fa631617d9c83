"""The `expert-cli` application: the commands of each group, `--verbose`, and the mapping of
errors to exit codes (2 for the user's input, 1 for failures at run time, 130 for Ctrl-C).

Every command module imports its library code inside the command's body, so that
`expert-cli --help` answers without importing torch.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import signal
import sys
import threading
import warnings
from typing import Annotated, Any, NoReturn

import typer

from expert_cli import __version__
from expert_cli.atomic import sigterm_raises
from expert_cli.cli import benchmark, check, data, evaluate, export, ship, train
from expert_cli.cli.help import Command, Group, examples
from expert_cli.cli.options import JSON_ASKED
from expert_cli.cli.render import one_line, print_error, silence
from expert_cli.deadline import TEMPLATE_LOOPS, TimedOut
from expert_cli.errors import Interrupted, RunError, Terminated, UserError
from expert_cli.paths import shown_path

app = typer.Typer(
    name="expert-cli",
    help="Train LoRA/DoRA/QLoRA expert adapters from HiveLLM manifests, and keep the GPU busy.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=Group,
)
DEMO = "experts/demo/manifest.json"
app.command(
    cls=Command,
    epilog=examples(
        f"expert-cli check -m {DEMO}",
        "expert-cli check -m experts/expert-sql/manifest.json --json",
        f"expert-cli check -m {DEMO} --set learning_rate=1e-3 --set max_seq_length=1024",
        "expert-cli check --list-settings",
    ),
)(check.check)
app.command(
    cls=Command,
    epilog=examples(
        f"expert-cli train -m {DEMO}",
        f"expert-cli train -m {DEMO} --set learning_rate=1e-3 --set epochs=1",
        f"expert-cli train -m {DEMO} --resume --max-steps 200",
        f"torchrun --nproc_per_node 2 -m expert_cli.cli train -m {DEMO}",
    ),
)(train.train)
app.command(
    cls=Command,
    epilog=examples("expert-cli merge --adapter experts/demo/output --output merged-demo"),
)(train.merge)
app.command(
    cls=Command,
    epilog=examples(
        'expert-cli generate --adapter experts/demo/output -p "List the 5 most recent orders."',
        "expert-cli generate --adapter experts/demo/output --eval 5 --compare-base",
        "expert-cli generate --adapter runs/sql --prompts prompts.txt --json",
    ),
)(ship.generate)
app.command(
    cls=Command,
    epilog=examples(
        "expert-cli evaluate --adapter experts/demo/output --compare-base",
        "expert-cli evaluate --adapter runs/sql/checkpoints/checkpoint-500 --split validation",
    ),
)(evaluate.evaluate)
app.command(
    cls=Command,
    epilog=examples(
        "expert-cli package --adapter experts/demo/output",
        "expert-cli package --adapter runs/sql --output dist/expert-sql.expert --force",
        "expert-cli check --package experts/demo/expert-demo-model.v0.1.0.expert",
    ),
)(ship.package)
app.command(
    "export-hub",
    cls=Command,
    epilog=examples(
        "expert-cli export-hub --adapter experts/demo/output --output hub/expert-demo",
        "expert-cli export-hub --adapter runs/sql --checkpoint best --output hub/sql "
        "--repo-id me/expert-sql",
        "hf upload me/expert-sql hub/sql",
    ),
)(export.export_hub)
app.command(
    "export-gguf",
    cls=Command,
    epilog=examples(
        "expert-cli export-gguf --adapter experts/demo/output",
        "expert-cli export-gguf --adapter runs/sql --checkpoint best --output sql-lora.gguf",
        "llama-cli -m Qwen3-0.6B-Q8_0.gguf --lora sql-lora.gguf",
    ),
)(export.export_gguf)
app.command(
    cls=Command,
    epilog=examples(
        "expert-cli report experts/demo/output",
        "expert-cli report runs/sql --output sql-run.png",
    ),
)(ship.report)
app.command(
    cls=Command,
    epilog=examples(
        f"expert-cli pretokenize -m {DEMO}",
        "expert-cli pretokenize --all experts --num-proc 8",
    ),
)(data.pretokenize)
app.command(
    "find-datasets",
    cls=Command,
    epilog=examples(
        "expert-cli find-datasets --experts experts", "expert-cli find-datasets --json"
    ),
)(data.find_datasets)
app.command(
    cls=Command,
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    epilog=examples(
        f"expert-cli benchmark --duration 60 -- expert-cli train -m {DEMO}",
        "expert-cli benchmark --duration 30 --output report.json --plot util.png",
        "expert-cli benchmark --workload qwen3-0.6b-lora --duration 120",
    ),
)(benchmark.benchmark)

_state = {"verbose": False}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"expert-cli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show tracebacks for failures.")
    ] = False,
    version: Annotated[
        bool,
        typer.Option("--version", is_eager=True, callback=_version, help="Print the version."),
    ] = False,
) -> None:
    _state["verbose"] = verbose


# bitsandbytes' CPU backend warns on every import that it could not fetch an optional kernel
# from the hub; it falls back to its own kernel, and hub fetches cannot happen offline anyway.
QUIET_LOGGERS = (
    "bitsandbytes.backends.cpu.ops",
    # "MatMul8bitLt: inputs will be cast ... to float16" at every int8 matmul (tens of
    # thousands of lines an evaluation of Qwen3-0.6B); its only message
    "bitsandbytes.autograd._functions",
    # where it keeps its font cache when HOME or MPLCONFIGDIR cannot be written (training.png
    # is drawn all the same)
    "matplotlib",
    # a hub snapshot read as a local folder without a README's metadata block: nothing wrong
    "huggingface_hub.repocard",
    # a dataset card whose features do not fit its files (the error that follows says it)
    "datasets.info",
)
# the datasets library's builders log a file they cannot read with the reader's own message,
# which may quote a row (a string its card types as a number: the whole example), before the
# error that names the field: logged at ERROR, so these are kept to CRITICAL
QUOTING_LOGGERS = tuple(
    f"datasets.packaged_modules.{name}.{name}"
    for name in ("parquet", "csv", "arrow", "json", "cache")
)
# transformers' advice no user of expert-cli can act on: batches are built here (packed rows
# kept apart by the checked attention, padding out of the loss), and every model without a
# loss type of its own gets the standard causal loss
QUIET_ADVICE = (
    "We strongly recommend passing in an `attention_mask`",
    "`loss_type=None` was set in the config but it is unrecognized",
    # a resume whose logging or save steps, or micro-batch, differ from the checkpoint's: the
    # run compares what makes it another run itself (train/same_run.py), and says so
    "Warning: The following arguments do not match the ones in the `trainer_state.json`",
    # checkpoints saved within a second (a short run): it orders them by step instead, which
    # is what the run folder's own listing does (train/checkpoints.py)
    "mtime may not be reliable on this filesystem",
)


# transformers' table of the weights a base's files lack or hold beyond its config: the loading
# code reads the same account and says it in a line (train/base_load.py)
LOAD_REPORT = " LOAD REPORT"


class _DropAdvice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        return not message.startswith(QUIET_ADVICE) and LOAD_REPORT not in message


OUT_OF_MEMORY = (
    "out of memory: this command needs more memory than the GPU (or, without one, this "
    "machine) has. Free it of other processes (nvidia-smi lists a GPU's), or run it where "
    "there is more memory"
)


def _out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is an allocation that failed (`train` says more itself); only torch
    raises one, so no torch import is paid where it was not loaded."""
    if "torch" not in sys.modules:
        return False
    from expert_cli.train.memory import out_of_memory

    return out_of_memory(exc)


def main() -> None:
    """Console-script entry point."""
    JSON_ASKED["on"] = False  # (a second call in one process: the tests')
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    for name in QUOTING_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    for name in ("transformers.modeling_utils", "transformers.trainer_utils"):
        logging.getLogger(name).addFilter(_DropAdvice())
    # raised inside peft/transformers for every model; nothing a user of expert-cli can act on
    warnings.filterwarnings(
        "ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning
    )
    # peft switching the layout for GPT-2's Conv1D layers, as it must
    warnings.filterwarnings("ignore", message="fan_in_fan_out is set to False but the target")
    # warmup_stable_decay given num_stable_steps (the Trainer always passes the step count too)
    warnings.filterwarnings("ignore", message="Both num_training_steps and num_stable_steps")
    # accelerate choosing CPU threads for a process of several (torchrun sets them itself)
    warnings.filterwarnings("ignore", message="OMP_NUM_THREADS/MKL_NUM_THREADS unset")
    threading.excepthook = _thread_failed
    for stream in (sys.stdout, sys.stderr):  # output that takes ASCII alone (an uncoerced C
        # locale, PYTHONIOENCODING=ascii): a path's é was a UnicodeEncodeError traceback
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(errors="backslashreplace")
    try:
        with sigterm_raises():  # a command with nothing of its own to say of SIGTERM or
            app(standalone_mode=True, prog_name="expert-cli")  # SIGHUP says it as Ctrl-C's
    except SystemExit as exc:  # click refused the command line (its own box on stderr)
        refused = exc.__context__
        if exc.code == 130 and isinstance(refused and refused.__context__, KeyboardInterrupt):
            # Ctrl-C where the command has nothing of its own to say of it (click's 130)
            _fail("interrupted", RunError("stopped by Ctrl-C"), 130)
        if _usage_error(refused) and _json_in_argv():
            said = {"kind": "error", "exit_code": refused.exit_code, "lines": _lines(refused)}
            typer.echo(json.dumps({"error": said}, indent=2, ensure_ascii=False))
        raise
    except UserError as exc:
        if _state["verbose"]:
            raise
        # an option's own parser refused its value before --json's callback was reached
        JSON_ASKED["on"] = JSON_ASKED["on"] or _json_in_argv()
        _fail("error", exc, 2)
    except RunError as exc:
        if _state["verbose"]:
            raise
        _fail("failed", exc, 1)
    except Interrupted as exc:  # a command that says what the interrupt left
        _fail("interrupted", exc, exc.code)
    except Terminated as exc:  # (it ended in silence: no line, no JSON under --json)
        name = signal.Signals(exc.code - 128).name if exc.code > 128 else "a signal"
        _fail("interrupted", RunError(f"stopped by {name}"), exc.code)
    except TimedOut:  # only a chat template's render is bounded
        _fail("error", UserError(TEMPLATE_LOOPS), 2)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        if _state["verbose"]:
            raise
        if _out_of_memory(exc):
            _fail("failed", RunError(OUT_OF_MEMORY), 1)
        said = _system_error(exc)
        if said is None:
            raise
        _fail(*(("error", said, 2) if isinstance(said, UserError) else ("failed", said, 1)))


def console_script() -> None:
    """The `expert-cli` console script: `main`, then an end that a signal does not garble. A
    Ctrl-C or SIGTERM while the interpreter shuts down (torch's and the datasets library's
    exit hooks run after the command's last line) printed the standard library's "Exception
    ignored" traceback and lost the command's exit code: now the process ends at once with
    that code, its work already done and said."""
    code = 1  # an exception no handler turned into a line: its traceback is printed
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        raise
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: _end_now(code))


def _end_now(code: int) -> NoReturn:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


FULL_DISK = (errno.ENOSPC, errno.EDQUOT)


def _thread_failed(args: Any) -> None:
    """A thread's exception: a full disk (TensorBoard's writer thread) is said by the command
    itself, where the writer hands it on, so its traceback is not printed beside that line."""
    if isinstance(args.exc_value, OSError) and args.exc_value.errno in FULL_DISK:
        return
    threading.__excepthook__(args)


def _fail(kind: str, exc: BaseException, code: int) -> NoReturn:
    """Say `exc` on stderr (and, where --json was asked, as a JSON object on stdout) and exit
    with `code`."""
    print_error(kind, exc)
    if JSON_ASKED["on"]:
        lines = exc.lines if isinstance(exc, UserError) else str(exc).splitlines()
        said = {"kind": kind, "exit_code": code, "lines": [one_line(line) for line in lines]}
        try:
            typer.echo(json.dumps({"error": said}, indent=2, ensure_ascii=False))
        except OSError:  # stdout full or gone (what failed, most likely): said on stderr
            silence("stdout")
    sys.exit(code)


def _json_in_argv() -> bool:
    """Whether the command line holds --json before a `--` (click refuses an option before
    --json's own callback runs, an unknown one before any)."""
    args = sys.argv[1:]
    return JSON_ASKED["on"] or "--json" in args[: args.index("--") if "--" in args else None]


def _usage_error(exc: BaseException | None) -> bool:
    """Whether `exc` is click's refusal of the command line (typer carries click's
    exceptions: a UsageError, a BadParameter, an unknown option), not an exit it asked for."""
    return isinstance(exc, typer.TyperException) and hasattr(exc, "format_message")


def _lines(refused: Any) -> list[str]:
    """click's message for a refused command line, as lines (its box's text)."""
    return [one_line(line) for line in refused.format_message().splitlines() if line.strip()]


def _system_error(exc: BaseException) -> UserError | RunError | None:
    """What the file system refused, where no command said it better: a name over the file
    system's limit or a link loop in a path the user gave (exit 2), a full disk (exit 1).
    Every write goes through a temporary name first, so nothing half-written is left."""
    if isinstance(exc, RuntimeError) and "Symlink loop" in str(exc):  # pathlib's resolve()
        return UserError("a path given holds a link loop (a link that leads back to itself)")
    if isinstance(exc, UnicodeEncodeError) and exc.reason == "surrogates not allowed":
        return UserError("a path or text given holds bytes that are not UTF-8 text")
    if not isinstance(exc, OSError):
        return None
    where = exc.filename if isinstance(exc.filename, str) else None
    place = f"{one_line(shown_path(where))}: " if where else ""
    if exc.errno == errno.ENAMETOOLONG:
        return UserError(
            f"{place}a name in this path is too long for the file system (over "
            "255 bytes, or the whole path over 4,096); give a shorter one"
        )
    if exc.errno == errno.ELOOP:
        return UserError(f"{place}holds a link loop (a link that leads back to itself)")
    if exc.errno in FULL_DISK:
        return RunError(f"{place}no space left on the device; free space and run it again")
    return None
