"""The names inside a package's archive: which belong in a package (no path outside it, no
link or device, no control characters), and which unpack onto one another (a name twice, a
file under a file, names one file on a system that ignores case or Unicode form); and the
archive written, byte-for-byte the same for the same members."""

from __future__ import annotations

import gzip
import io
import tarfile
import unicodedata
from pathlib import Path, PurePosixPath
from typing import Any

from expert_cli.errors import escaped
from expert_cli.paths import NAME_MAX_BYTES
from expert_cli.train.adapter_entry import first_base
from expert_cli.train.outputs import ADAPTER_FILES
from expert_cli.train.tokenizer_files import TOKENIZER_FILES

EXPERT_FILES = ("README.md", "LICENSE", "LICENSE.md", "LICENSE.txt")  # from the expert's folder
TEMPLATE_FILE = "chat_template.jinja"  # the run's tokenizer's template, as it saved it
SHOWN_MEMBERS = 3  # members a note names


def named_files(manifest: Any) -> list[tuple[str, Any]]:
    """(field, value) of each file a package's manifest names beside the adapter: the grammar
    file and the soft prompts' paths, as written (any value; nothing where the manifest is
    not of that shape)."""
    manifest = manifest if isinstance(manifest, dict) else {}
    training = manifest.get("training")
    decoding = training.get("decoding") if isinstance(training, dict) else None
    named = (
        [("training.decoding.grammar_file", decoding.get("grammar_file"))]
        if isinstance(decoding, dict)
        else []
    )
    prompts = manifest.get("soft_prompts")
    for i, prompt in enumerate(prompts if isinstance(prompts, list) else []):
        if isinstance(prompt, dict):
            named.append((f"soft_prompts[{i}].path", prompt.get("path")))
    return named


def unexpected_members(files: list[str], manifest: dict[str, Any]) -> list[str]:
    """A note naming the members `package` does not write and HiveLLM's loader does not read
    (a script, a large file added to a package): installed with it, all the same."""
    known = {"manifest.json", "grammar.gbnf", *ADAPTER_FILES, *TOKENIZER_FILES, *EXPERT_FILES}
    named = [name for _, name in named_files(manifest)]
    known |= {PurePosixPath(n).as_posix() for n in named if isinstance(n, str) and n}
    other = [name for name in files if name not in known]
    if not other:
        return []
    shown = ", ".join(escaped(n) for n in other[:SHOWN_MEMBERS])
    more = f" and {len(other) - SHOWN_MEMBERS} more" if len(other) > SHOWN_MEMBERS else ""
    return [
        f"{len(other)} member(s) that package does not write and HiveLLM's loader does not read "
        f"({shown}{more}): installed with the package all the same"
    ]


def _unpacked(name: str) -> str:
    """What a file system that ignores case and Unicode forms (macOS, Windows) makes of a
    member's name: `./A.json` and `a.json` are one file there."""
    return unicodedata.normalize("NFC", PurePosixPath(name).as_posix()).casefold()


def member_problem(member: tarfile.TarInfo, seen: dict[str, tuple[str, bool]]) -> str | None:
    """Why an archive's member does not belong in a package; None when it does, and then it is
    recorded in `seen` (name as unpacked -> (its name, whether a folder)), with the folders it
    lies in."""
    name, shown = member.name, escaped(member.name)
    if name != shown:
        return f"{shown}: a name holding control characters or bytes that are not UTF-8"
    if name.startswith("/") or ".." in PurePosixPath(name).parts or "\\" in name:
        return f"{name}: a path outside the package"
    if not PurePosixPath(name).parts and not member.isdir():  # a file "" or "." (the
        # folder "./" is the package's root, as `tar -C run .` writes it)
        return f"{name or '<an empty name>'}: a member that names no file"
    if any(len(part.encode()) > NAME_MAX_BYTES for part in PurePosixPath(name).parts):
        return (
            f"{name[:40]}...: a name over {NAME_MAX_BYTES} bytes between slashes, which "
            "file systems do not hold (tar cannot unpack it)"
        )
    if member.size < 0:  # tarfile reads it, and stops at the next header
        return f"{name}: its header gives a negative size (a damaged or forged archive)"
    if (not member.isfile() and not member.isdir()) or member.issparse():
        return (
            f"{name}: not a regular file (links, devices and sparse files do not belong in a "
            "package)"
        )
    path = PurePosixPath(name)
    for folder in [*reversed(path.parents[:-1]), path]:
        first, is_folder = seen.get(_unpacked(str(folder)), (None, folder != path))
        if folder != path and first is not None and not is_folder:
            return f"{path}: lies under {first}, which the package holds as a file"
        if folder == path and first is not None and not (is_folder and member.isdir()):
            return _clash(path.as_posix(), first, is_folder, member.isdir())
        seen.setdefault(_unpacked(str(folder)), (folder.as_posix(), folder != path))
    seen[_unpacked(name)] = (path.as_posix(), member.isdir())
    return None


def _clash(name: str, first: str, first_folder: bool, folder: bool) -> str:
    if first_folder != folder:
        return f"{name}: a {'folder' if folder else 'file'} where the package has a " + (
            f"{'folder' if first_folder else 'file'} of that name ({first})"
        )
    if first == name:
        return f"{name}: in the package twice (unpacking keeps the last, this check the first)"
    return (
        f"{name}: the same file as {first} where names ignore case or Unicode form (macOS, "
        "Windows): unpacking there keeps only one"
    )


def write_tar(dest: Path, members: dict[str, bytes | Path]) -> None:
    """The archive, byte-for-byte the same for the same members (no names, times or owners
    from this machine in the gzip or tar headers)."""
    order = ["manifest.json", *sorted(n for n in members if n != "manifest.json")]
    with (
        open(dest, "wb") as raw,
        gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.GNU_FORMAT) as tar,
    ):
        for name in order:
            item = members[name]
            info = tarfile.TarInfo(name)
            info.mode, info.mtime, info.uid, info.gid = 0o644, 0, 0, 0
            if isinstance(item, bytes):
                info.size = len(item)
                tar.addfile(info, io.BytesIO(item))
            else:
                info.size = item.stat().st_size
                with item.open("rb") as f:
                    tar.addfile(info, f)


def shipped_template(manifest: dict[str, Any], members: Any) -> list[str]:
    """Point the packaged manifest's chat template file (a base model's `chat_template`, a
    path on the training machine) at the package's own copy, which the run's tokenizer saved
    as chat_template.jinja, so that the manifest unpacked trains again as it was; a note."""
    base = first_base(manifest)
    named = base.get("chat_template")
    if not isinstance(named, str) or named.lower() in ("chatml", TEMPLATE_FILE):
        return []
    if TEMPLATE_FILE not in members:
        return []
    base["chat_template"] = TEMPLATE_FILE
    where = "base_models[0]" if manifest.get("schema_version") == "2.0" else "base_model"
    return [
        f"{where}.chat_template: {named} ships as the package's {TEMPLATE_FILE} (the template "
        "the run's tokenizer saved), which the packaged manifest names"
    ]


def dropped_start(manifest: dict[str, Any]) -> list[str]:
    """Leave `training.config.init_adapter` (a folder on the training machine the run
    started from) out of the packaged manifest: the package's adapter holds what was trained
    from it, and unpacked elsewhere the manifest would name a folder that is not there."""
    training = manifest.get("training")
    config = training.get("config") if isinstance(training, dict) else None
    if not isinstance(config, dict) or config.pop("init_adapter", None) is None:
        return []
    return [
        "training.config.init_adapter: the folder the run started from is on the training "
        "machine, left out of the packaged manifest (the adapter holds what it trained)"
    ]


def named_file_problems(manifest: dict[str, Any], files: Any) -> tuple[list[str], list[str]]:
    """(problems, notes) of the files the manifest names, which HiveLLM's chat reads from the
    package's folder: one that leads out of it is a problem (a file of the machine the
    package is installed on would be read), one the package does not hold a note; and a
    manifest that lays prompts out by the chat template (`prompt_template: chat_template`)
    in a package without one (it was called sound)."""
    problems, notes = [], []
    for where, name in named_files(manifest):
        if not isinstance(name, str):
            continue
        parts = PurePosixPath(name.replace("\\", "/")).parts
        if not parts or parts[0] == "/" or ".." in parts or ":" in name:
            problems.append(
                f"manifest.json: {where}: leads out of the package; expected a file inside it"
            )
        elif PurePosixPath(*parts).as_posix() not in files:
            notes.append(f"manifest.json: {where}: names a file the package does not hold")
    layout = first_base(manifest).get("prompt_template")
    if str(layout).lower() == "chat_template" and TEMPLATE_FILE not in files:
        problems.append(
            "chat_template.jinja: missing, and base_models[0].prompt_template is chat_template: "
            "prompts are laid out by it"
        )
    return problems, notes
