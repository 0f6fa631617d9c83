"""Instruction data's layouts (`prompt_template`): ChatML, Alpaca, Llama 2 and Vicuna
written here; `chat_template` renders each example as a conversation (system, user,
assistant) with the tokenizer's own chat template, through the conversation path."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from expert_cli.data.spans import CHATML_ASSISTANT, CHATML_END
from expert_cli.errors import UserError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

VICUNA_SYSTEM = (
    "A chat between a curious user and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the user's "
    "questions."
)
ALPACA_HEAD = "Below is an instruction that describes a task"
ALPACA_TAIL = "Write a response that appropriately completes the request.\n\n"
# instruction data as a conversation (system, user, assistant) of the tokenizer's chat template
CHAT_TEMPLATE = "chat_template"
TEMPLATES = ("chatml", "alpaca", "llama2", "vicuna", CHAT_TEMPLATE)
# The space between a prompt and its answer belongs to the answer: BPE joins it to the first
# word (" Yes"), so at the prompt's end it left that token on the prompt side, never trained,
# and a generation prompt ending in a space asked for a token training never showed.
COMPLETION_PREFIX = {"llama2": " ", "vicuna": " "}


def _user_text(instruction: str, input_: str | None) -> str:
    """The user's turn of an instruction example: the instruction, then its input."""
    return f"{instruction}\n\n{input_}" if input_ else instruction


def instruction_turns(
    instruction: str, input_: str | None, system: str | None, response: str
) -> list[dict[str, str]]:
    """One instruction example as the conversation `prompt_template: chat_template` renders."""
    user = _user_text(instruction, input_)
    head = [{"role": "system", "content": system}] if system else []
    return [*head, {"role": "user", "content": user}, {"role": "assistant", "content": response}]


def render_instruction(
    template: str, instruction: str, input_: str | None, system: str | None
) -> tuple[str, str]:
    """(prompt, completion suffix) of one instruction example in `prompt_template` (not
    chat_template, which the tokenizer's chat template renders as a conversation)."""
    user = _user_text(instruction, input_)
    if template == "chatml":
        head = f"<|im_start|>system\n{system}{CHATML_END}\n" if system else ""
        return f"{head}<|im_start|>user\n{user}{CHATML_END}\n{CHATML_ASSISTANT}\n", CHATML_END
    if template == "alpaca":
        head = f"{system}\n\n" if system else ""
        if input_:
            return (
                f"{head}{ALPACA_HEAD}, paired with an input that provides further context. "
                f"{ALPACA_TAIL}### Instruction:\n{instruction}\n\n### Input:\n{input_}\n\n"
                "### Response:\n",
                "",
            )
        return (
            f"{head}{ALPACA_HEAD}. {ALPACA_TAIL}### Instruction:\n{instruction}\n\n### Response:\n",
            "",
        )
    if template == "llama2":
        head = f"<<SYS>>\n{system}\n<</SYS>>\n\n" if system else ""
        return f"[INST] {head}{user} [/INST]", ""
    if template == "vicuna":
        return f"{system or VICUNA_SYSTEM} USER: {user} ASSISTANT:", ""
    raise UserError(
        f"the base model's prompt_template {template!r} needs a template text, which "
        f"the manifest does not give; use one of {list(TEMPLATES)} or put the "
        "rendered prompt in a `text` field"
    )


def check_prompt_template(template: str) -> None:
    """Fail early (in the main process) when instruction data has no usable template (a
    chat template is checked with its tokenizer: check_chat_template)."""
    if template != CHAT_TEMPLATE:
        render_instruction(template, "", None, None)


def chatml_note(tokenizer: PreTrainedTokenizerFast, template: str) -> str | None:
    """A note where instruction data is laid out in ChatML while the tokenizer's own chat
    template writes another layout (Llama 3's headers): merge and package ship that template,
    and what prompts by it (vLLM, Ollama, apply_chat_template) asks in a layout the adapter
    never saw."""
    if template != "chatml" or not tokenizer.chat_template:
        return None
    turn = [{"role": "user", "content": "q"}]
    try:
        text = tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - a template that does not run: the build says so
        return None
    if f"<|im_start|>user\nq{CHATML_END}\n{CHATML_ASSISTANT}\n" in str(text):
        return None
    return (
        "base_models[0].prompt_template: instruction data is laid out in ChatML, while the "
        "tokenizer's chat template writes another layout, which merge and package ship and "
        "which vLLM, Ollama or apply_chat_template prompt the adapter with; set it to "
        '"chat_template" to train in the template\'s own layout (generate follows either)'
    )


def as_turns(batch: dict[str, list[Any]], n: int) -> list[list[dict[str, str]]]:
    """A batch of instruction rows as the conversations `chat_template` renders."""
    inputs = batch.get("input") or [None] * n
    systems = batch.get("system") or [None] * n
    return [
        instruction_turns(str(ins), inp, sys_, str(resp))
        for ins, inp, sys_, resp in zip(
            batch["instruction"], inputs, systems, batch["response"], strict=True
        )
    ]
