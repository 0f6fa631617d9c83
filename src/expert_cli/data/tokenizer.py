"""Loading the base model's fast tokenizer for the data path."""

from __future__ import annotations

import json
import logging
import re
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jinja2.exceptions import TemplateSyntaxError
from transformers import AutoConfig, AutoTokenizer

from expert_cli.config.base import encodes
from expert_cli.config.refs import windows_note
from expert_cli.config.resolve import ResolvedConfig
from expert_cli.deadline import TEMPLATE_SECONDS, TimedOut, deadline
from expert_cli.errors import UserError
from expert_cli.paths import path_exists, path_is_dir, shown_path

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

log = logging.getLogger(__name__)
# Fewer tokens than this is no language model's tokenizer: transformers 5 builds an empty one
# (no tokens, or only its end token) from a folder whose vocabulary files are missing.
MIN_VOCABULARY = 32
# a path Python keeps with a byte that is not UTF-8 (a lone surrogate), which the tokenizers
# library (Rust strings) cannot be given
NOT_UTF8_PATH = (
    "holds bytes that are not UTF-8, which the tokenizers library cannot open; rename or move "
    "the folder"
)


def _damaged(model: str, exc: BaseException) -> UserError:
    folder = Path(model)
    if isinstance(exc, UnicodeEncodeError) and not encodes(model):  # the path, not the files
        return UserError(f"base_models[0].name: the path {shown_path(model)} {NOT_UTF8_PATH}")
    vocabulary = ("tokenizer.json", "vocab.json", "tokenizer.model", "spiece.model")
    if path_is_dir(model) and not any(path_exists(folder / n) for n in vocabulary):
        return UserError(  # tokenizer_config.json alone: transformers fails in a conversion
            f"base_models[0].name: the tokenizer of {shown_path(model)} has no "
            "tokenizer.json (nor vocab.json or tokenizer.model); copy the model's tokenizer "
            "files into it"
        )
    return UserError(
        f"base_models[0].name: the tokenizer files of {model} are damaged ({type(exc).__name__} "
        "while reading them); copy tokenizer.json and tokenizer_config.json from the model again"
    )


SIZE_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers")


def config_problem(source: str, trust_remote_code: bool) -> str | None:
    """Why a local model folder's config.json is no model configuration (read_config); None
    when it is one or is not there (a hub model; a folder without one is said where the model
    is loaded). The tokenizer loader reads config.json too, and its failure was blamed on the
    tokenizer files."""
    if not path_exists(Path(source) / "config.json"):
        return None
    return read_config(source, trust_remote_code)[1]


def read_config(source: str, trust_remote_code: bool) -> tuple[Any | None, str | None]:
    """(the model configuration at `source`, None), or (None, why a local folder's config.json
    is none: not JSON, custom code not trusted, a field of the wrong type, a size below 1),
    naming the field, never its value. (None, None) for a hub model not in the cache."""
    local, shown = path_is_dir(source), f"base model {shown_path(source)}"
    if local and path_exists(Path(source) / "config.json"):
        try:
            json.loads((Path(source) / "config.json").read_bytes())
        except (OSError, ValueError) as exc:
            at = f" at line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else ""
            return None, f"{shown}: config.json is not JSON{at} ({type(exc).__name__})"
    try:
        config = AutoConfig.from_pretrained(
            source, trust_remote_code=trust_remote_code, local_files_only=True
        )
    except Exception as exc:  # noqa: BLE001 - whatever the user's config.json makes it raise
        if not local:
            return None, None
        if "trust_remote_code" in str(exc):
            return None, (
                f'{shown}: its config.json is custom code; set "trust_remote_code": true on '
                "the base model entry if you trust it"
            )
        field = re.search(r"field '(\w+)'", str(exc))
        what = f"; {field.group(1)} has the wrong type" if field else ""
        return None, (
            f"{shown}: config.json cannot be read as a model configuration "
            f"({type(exc).__name__}{what})"
        )
    for name in SIZE_FIELDS:  # a size of 0 built a model of empty layers that "trained"
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            named = getattr(type(config), "attribute_map", {}).get(name, name)  # GPT-2: n_layer
            return None, f"{shown}: config.json gives {named} below 1; a model needs at least one"
    return config, None


def load_tokenizer(resolved: ResolvedConfig, local_only: bool = False) -> PreTrainedTokenizerFast:
    """The fast tokenizer of `resolved.base_model`; pad = eos when it has no pad token (logged).
    With `local_only`, from the files already on this machine (nothing is downloaded).

    Only fast (Rust) tokenizers are accepted: batched encoding and character offsets, which
    exact completion-only masking relies on, exist only there.
    """
    where = resolved.base_model
    if resolved.base_model_kind == "local" and not path_is_dir(where):
        why = windows_note(where) or " (expected a local model folder with its tokenizer files)"
        raise UserError(f"base_models[0].name: {shown_path(where)} is not a folder{why}")
    if resolved.base_model_kind == "local" and (
        problem := config_problem(where, resolved.trust_remote_code)
    ):
        raise UserError(problem)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            resolved.base_model,
            revision=resolved.revision,
            trust_remote_code=resolved.trust_remote_code,
            use_fast=True,
            local_files_only=local_only,
        )
    except OSError as exc:  # files missing here or on the hub: the loader says which
        raise UserError(
            f"base_models[0].name: cannot load a tokenizer from {resolved.base_model} ({exc})"
        ) from None
    except ImportError as exc:  # a slow tokenizer converted with a package not installed
        raise UserError(
            f"base_models[0].name: the tokenizer of {resolved.base_model} needs the Python package "
            f"{exc.name or 'its loader names'} (pip install it), or a tokenizer.json"
        ) from None
    except ValueError as exc:
        if "trust_remote_code" not in str(exc):
            raise _damaged(resolved.base_model, exc) from None
        raise UserError(
            f"base_models[0].name: the tokenizer of {resolved.base_model} is custom code; set "
            '"trust_remote_code": true on the base model entry if you trust it'
        ) from None
    except Exception as exc:  # noqa: BLE001 - a file the loader cannot parse is the user's
        raise _damaged(resolved.base_model, exc) from None
    _refuse_unusable(tokenizer, resolved.base_model)
    if resolved.chat_template:  # saved with the run's tokenizer: generate and merge use it
        tokenizer.chat_template = chat_template_text(resolved.chat_template)
    _refuse_broken_template(tokenizer, resolved.chat_template)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
        log.info("tokenizer has no pad token; using eos %r as pad", tokenizer.eos_token)
    return tokenizer


# ChatML, for a base without a chat template of its own (`chat_template: "chatml"`)
CHATML_TEMPLATE = (
    "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "(message['content'] or '') + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
MAX_TEMPLATE_BYTES = 1 << 20  # a chat template file: Jinja text, never this large


def _refuse_broken_template(tokenizer: Any, given: str | None) -> None:
    """A chat template that runs over TEMPLATE_SECONDS on a two-message conversation (Jinja
    loops without end) is refused, naming where it came from, and so is a manifest's template
    file that is not Jinja at all (the run would ship it, whatever its data: text data trained
    and packaged it, and the merged model's template raised); one that refuses the
    conversation is left to the data's checks (text data does not use it)."""
    if not tokenizer.chat_template:
        return
    probe = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    given_file = given is not None and given != "chatml"
    where = f"the file {shown_path(given)}" if given_file else "the model's"
    rendered = None
    try:
        with deadline(TEMPLATE_SECONDS) as bound:
            rendered = tokenizer.apply_chat_template(probe, tokenize=False)
    except TemplateSyntaxError:
        if given_file:
            raise UserError(
                f"base_models[0].chat_template: {shown_path(given)} is not a Jinja template "
                "(TemplateSyntaxError); fix the file"
            ) from None
    except (TimedOut, Exception):  # noqa: BLE001 - said where the data uses it, if not timed out
        if bound.expired:
            raise UserError(
                f"base_models[0]: the chat template ({where}) took over {TEMPLATE_SECONDS} s "
                "to render a two-message conversation (a loop without end?); fix the template"
            ) from None
    if rendered is not None and not str(rendered).strip():  # read as data with no answers
        raise UserError(
            f"base_models[0]: the chat template ({where}) renders nothing for a two-message "
            "conversation; fix the template"
        )


def chat_template_text(given: str) -> str:
    """The Jinja text of `base_models[0].chat_template` ("chatml", or a file's text); a file
    too large, unreadable or not UTF-8 is a UserError naming it (its text is never quoted)."""
    if given == "chatml":
        return CHATML_TEMPLATE
    label = f"base_models[0].chat_template: {shown_path(given)}"
    try:
        with open(given, "rb") as file:
            raw = file.read(MAX_TEMPLATE_BYTES + 1)
    except OSError as exc:
        raise UserError(f"{label} cannot be read ({exc.strerror or type(exc).__name__})") from None
    if len(raw) > MAX_TEMPLATE_BYTES:
        raise UserError(f"{label} is over {MAX_TEMPLATE_BYTES >> 20} MB; expected a Jinja template")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{label} is not UTF-8 text; expected a Jinja template") from None
    if not text.strip():
        raise UserError(f"{label} is empty; expected a Jinja template")
    return text


def _refuse_unusable(tokenizer: Any, model: str) -> None:
    """A tokenizer the pipeline cannot use: not fast, empty (its vocabulary files missing),
    or without an EOS token."""
    if not getattr(tokenizer, "is_fast", False):
        raise UserError(
            f"base_models[0].name: {model} has no fast tokenizer "
            "(tokenizer.json); expert-cli needs one for batched, offset-exact "
            "tokenization"
        )
    words = tokenizer.backend_tokenizer.get_vocab_size(with_added_tokens=False)
    if words < MIN_VOCABULARY:
        raise UserError(
            f"base_models[0].name: the tokenizer of {model} has {words} "
            f"token{'' if words == 1 else 's'}: its vocabulary files (tokenizer.json, or "
            "vocab.json and merges.txt) are missing, and transformers built an empty "
            "tokenizer. Copy the model's tokenizer files into it"
        )
    if tokenizer.eos_token_id is None:
        raise UserError(
            f"base_models[0].name: the tokenizer of {model} has no EOS "
            "token; every example must end with one"
        )
    if role := _special_not_in_vocabulary(tokenizer, words):
        raise UserError(
            f"base_models[0].name: the {role} token tokenizer_config.json names for {model} is "
            "not in its vocabulary (tokenizer.json): transformers would add it as a new token "
            "whose embedding the model never trained, and every example would end with it; "
            "name one of the vocabulary's tokens there"
        )


def _special_not_in_vocabulary(tokenizer: Any, words: int) -> str | None:
    """ "EOS" (or "BOS", "padding") where tokenizer_config.json names a token that the
    folder's tokenizer.json does not hold: transformers 5 appends such a token to the
    vocabulary as it loads. Tokens of the base vocabulary need no look; an added one is looked
    for in the file (a local folder only: a hub tokenizer's files are the hub's)."""
    roles = {"EOS": tokenizer.eos_token_id, "BOS": tokenizer.bos_token_id}
    roles["padding"] = tokenizer.pad_token_id
    added = {role: i for role, i in roles.items() if isinstance(i, int) and i >= words}
    file = Path(str(tokenizer.name_or_path or "")) / "tokenizer.json"
    if not added or not path_is_dir(file.parent) or not file.is_file():
        return None
    try:
        saved = _added_tokens(file)
    except (OSError, ValueError, AttributeError):
        return None  # the loader read it: whatever this reader cannot is not judged here
    held = {t.get("id") for t in saved if isinstance(t, dict)}
    return next((role for role, i in added.items() if i not in held), None)


# tokenizer.json (as the tokenizers library writes it) has its added tokens near its head,
# before the vocabulary: Qwen's 18 MB file parsed whole took about a second of each load
ADDED_TOKENS = re.compile(r'"added_tokens"\s*:\s*')
HEAD_BYTES = 1 << 20


def _added_tokens(file: Path) -> list[Any]:
    """The `added_tokens` of a tokenizer.json: decoded from the file's head where they are
    whole there, else from the whole file."""
    with file.open("rb") as f:
        head = f.read(HEAD_BYTES).decode("utf-8", errors="ignore")  # a cut character at the end
    if found := ADDED_TOKENS.search(head):
        with suppress(ValueError):
            value = json.JSONDecoder().raw_decode(head, found.end())[0]
            if isinstance(value, list):
                return value
    return json.loads(file.read_text(encoding="utf-8")).get("added_tokens") or []


def ids_in_use(tokenizer: PreTrainedTokenizerFast) -> int:
    """One past the largest id every run uses: the base vocabulary (ordinary text) and the
    end, padding and start tokens the pipeline inserts. Tokens added beyond the base vocabulary
    are left out: some models ship one past their embedding that text never produces (Gemma 3's
    image token); the token cache's own largest id is checked once data is tokenized."""
    base = tokenizer.backend_tokenizer.get_vocab_size(with_added_tokens=False)
    inserted = [tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.bos_token_id]
    return max([base, *(i + 1 for i in inserted if isinstance(i, int))])
