"""The tokenizer files a run saves beside its adapter: which of them a package ships, and
whether a loader can read each one (`package` refuses a run whose files cannot be read, and
`check --package` a package holding one); and the tokens an answer stops at."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tokenizers
from jinja2.exceptions import TemplateSyntaxError
from tokenizers import Tokenizer
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import (  # as it renders
    _compile_jinja_template,
    render_jinja_template,
)

from expert_cli.config.base import encodes
from expert_cli.data.tokenizer import NOT_UTF8_PATH
from expert_cli.deadline import TEMPLATE_SECONDS, TimedOut, deadline
from expert_cli.errors import UserError
from expert_cli.jsontext import json_int
from expert_cli.paths import shown_path

TOKENIZER_FILES = (  # as the run saves them; at the package's root
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",  # a SentencePiece model (Llama, Mistral): binary, not read here
    "chat_template.jinja",
)
# larger tokenizer files are no model's (Gemma 3's tokenizer.json, of 262k tokens, is 33 MB):
# package ships them unread, and check --package refuses them
TOKENIZER_CHECK_BYTES = 256 << 20
# end-of-turn tokens of the layouts the data may have (ChatML, <|user|> markers, Llama 2)
STOP_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|end|>", "</s>")


def stop_ids(tokenizer: Any) -> list[int]:
    """The ids an answer stops at: the tokenizer's EOS and each end-of-turn token it has as a
    token of its own (added or special: Qwen's vocabulary holds `</s>` as a piece of text,
    which merge wrote into generation_config.json as a stop)."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    vocab = tokenizer.get_vocab()
    own = set(getattr(tokenizer, "added_tokens_encoder", {})) | set(tokenizer.all_special_tokens)
    ids |= {vocab[t] for t in STOP_TOKENS if t in vocab and t in own}
    return sorted(ids)


@dataclass(frozen=True)
class Stops:
    """Where an answer ends: token ids, and texts the model learned as several tokens (a
    layout's `<|end|>` where the tokenizer has no such token); the answer is cut before the
    first of the layout's `markers` (a text, or a token that is not special, which decoding
    keeps)."""

    ids: list[int]
    texts: tuple[str, ...]  # the markers written as several tokens
    markers: tuple[str, ...]  # every marker, texts included

    def cut(self, text: str) -> str:
        ends = [i for i in (text.find(s) for s in self.markers) if i >= 0]
        return text[: min(ends)] if ends else text

    def held(self, text: str) -> int:
        """How many characters at the end of `text` may begin a stop text (held back from a
        stream until the next piece says)."""
        return max(
            (n for s in self.texts for n in range(1, len(s)) if text.endswith(s[:n])), default=0
        )


def layout_stops(tokenizer: Any, markers: Sequence[str]) -> Stops:
    """The answer's stops: `stop_ids`, and each of the prompt layout's `markers` (its turn end,
    the next turn's opening) as an id where the tokenizer writes it as one token, else as a
    text."""
    ids, texts = set(stop_ids(tokenizer)), []
    for marker in markers:
        one = tokenizer(marker, add_special_tokens=False, verbose=False)["input_ids"]
        if len(one) == 1:
            ids.add(one[0])
        else:
            texts.append(marker)
    return Stops(sorted(ids), tuple(texts), tuple(markers))


def tokenizer_problem(name: str, data: bytes) -> str | None:
    """What a loader would fail on in one of the tokenizer files (None: it reads)."""
    if name == "tokenizer.model":
        return None  # SentencePiece's protobuf: the loader alone judges it
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "not UTF-8 text"
    if name == "tokenizer.json":
        try:
            Tokenizer.from_str(text)
        except Exception:  # the library's own error, whatever it is: never quoted
            return f"not a tokenizer the tokenizers library ({tokenizers.__version__}) can read"
    elif name == "chat_template.jinja":
        return _template_problem(text)
    elif name.endswith(".json"):
        try:
            value = json.loads(text, parse_int=json_int)
        except (ValueError, RecursionError):
            return "not readable JSON"
        if not isinstance(value, dict):
            return "not a JSON object"
    return None


def _template_problem(text: str) -> str | None:
    """What is wrong with a chat template's text as transformers compiles it (its own
    environment: a template using its `{% generation %}` tag compiles) and renders a prompt
    of one user turn (what `generate` and HiveLLM's chat lay out), bounded in time; None
    when it does."""
    if not text.strip():
        return "empty (a chat template renders every prompt from it)"
    try:
        _compile_jinja_template(text)
    except TemplateSyntaxError:
        return "not a Jinja template transformers can compile (TemplateSyntaxError)"
    user = {"role": "user", "content": "q"}  # then with a system turn: a template may ask one
    prompts = [[user], [{"role": "system", "content": "s"}, user]]
    try:
        with deadline(TEMPLATE_SECONDS) as bound:
            rendered = _first_rendered(text, prompts)
    except (TimedOut, Exception) as exc:  # noqa: BLE001 - the template's error: never quoted
        if bound.expired:
            return f"took over {TEMPLATE_SECONDS} s to render a prompt (a loop without end?)"
        return (
            f"raises on a prompt of one user turn, with or without a system turn "
            f"({type(exc).__name__}): {UNRENDERED}"
        )
    if not rendered.strip():
        return f"renders nothing for a prompt of one user turn: {UNRENDERED}"
    return None


UNRENDERED = "no prompt is laid out by it"
# what apply_chat_template gives a template beside the conversation: the tokenizer's special
# tokens (Llama 3's `bos_token + content` raised without them), here as stand-ins
SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                  "pad_token": "<pad>", "sep_token": "<sep>", "cls_token": "<cls>",
                  "mask_token": "<mask>", "additional_special_tokens": []}  # fmt: skip


def _first_rendered(text: str, prompts: list[list[dict[str, str]]]) -> str:
    """The first of `prompts` the template renders with a generation prompt (the last one's
    error where none renders), given the special tokens as apply_chat_template gives them."""
    for prompt in prompts[:-1]:
        try:
            return _rendered(text, prompt)
        except Exception:  # noqa: BLE001, S112 - the next prompt tried (TimedOut is none)
            continue
    return _rendered(text, prompts[-1])


def _rendered(text: str, prompt: list[dict[str, str]]) -> str:
    out = render_jinja_template(
        [prompt], chat_template=text, add_generation_prompt=True, **SPECIAL_TOKENS
    )
    return str(out[0][0])


def missing_tokenizer_file(names: Collection[str]) -> str | None:
    """The file a loader needs that is missing from a set of tokenizer files (a run's or a
    package's): tokenizer.json beside tokenizer_config.json, unless vocab.json and merges.txt,
    or a SentencePiece tokenizer.model, are there to build it from; None when nothing is
    missing (or no tokenizer is there)."""
    if "tokenizer_config.json" not in names or {"tokenizer.json", "tokenizer.model"} & {*names}:
        return None
    if "vocab.json" in names and "merges.txt" in names:
        return None
    return (
        "tokenizer.json: missing beside tokenizer_config.json (a loader cannot build the "
        "tokenizer from the rest)"
    )


def tokenizer_members(folder: Path) -> tuple[dict[str, Path], list[str]]:
    """The tokenizer files a run saved in `folder`, to ship, and a note when it holds none;
    UserError naming a file a loader could not read, or one it needs that is missing."""
    files = {n: folder / n for n in TOKENIZER_FILES if (folder / n).is_file()}
    for name, path in files.items():
        small = path.stat().st_size <= TOKENIZER_CHECK_BYTES
        if small and (problem := tokenizer_problem(name, path.read_bytes())):
            copied = "copy the run's tokenizer files back from one of its checkpoints "
            copied += "(checkpoints/checkpoint-N/ holds them), or train again"
            fix = "fix the chat template the run was given (base_models[0].chat_template, or "
            fix += "the base model's) and train again, or copy a checkpoint's back if it differs"
            raise UserError(
                f"{shown_path(path)}: {problem}; {fix if UNRENDERED in problem else copied}"
            )
    if missing := missing_tokenizer_file(files):
        raise UserError(
            f"{shown_path(folder)}: {missing}; copy it back from one of the run's checkpoints "
            "(checkpoints/checkpoint-N/ holds it), or train again"
        )
    if "tokenizer.json" in files or "tokenizer_config.json" in files:
        return files, []
    return files, [f"{shown_path(folder)} holds no tokenizer files: the package has none"]


TOKENIZER_LOAD_ERRORS = (OSError, ValueError, KeyError, RuntimeError, TypeError)


def tokenizer_folder(adapter: Path, run_dir: Path) -> Path:
    """Where the tokenizer of `adapter` (the run or one of its checkpoints) is: beside it when
    saved there, else in the run folder (a run that stopped before its end, diverged, saved
    it in its checkpoints only)."""
    return adapter if (adapter / "tokenizer_config.json").is_file() else run_dir


def saved_tokenizer(adapter: Path, run_dir: Path) -> Any:
    """The tokenizer a run saved, from `adapter` (the run or one of its checkpoints) when it
    holds one, else from the run folder. UserError naming the file a loader cannot read or
    needs and is missing, a folder without tokenizer files, or a path the tokenizers library
    cannot open (bytes that are not UTF-8), before anything else is loaded."""
    folder = tokenizer_folder(adapter, run_dir)
    files, none = tokenizer_members(folder)
    if none:
        raise UserError(
            f"--adapter {shown_path(adapter)}: no tokenizer files (tokenizer.json, "
            "tokenizer_config.json) in it or its run folder; copy them back from one of the "
            "run's checkpoints, or train again"
        )
    if not encodes(str(folder)):
        raise UserError(f"--adapter {shown_path(adapter)}: its path {NOT_UTF8_PATH}")
    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except TOKENIZER_LOAD_ERRORS as exc:  # the loader's message may quote a file: not shown
        names = ", ".join(sorted(files))
        raise UserError(
            f"--adapter {shown_path(adapter)}: its tokenizer ({names} in "
            f"{shown_path(folder)}) cannot be loaded ({type(exc).__name__}); copy the files "
            "back from one of the run's checkpoints, or train again"
        ) from None
