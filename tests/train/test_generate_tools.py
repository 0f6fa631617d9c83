"""`generate --tools FILE`: a tool-calling expert tried with the definitions it trained with
(its training prompts held them; generate's were rendered without any)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from train_helpers import run_main

from expert_cli.data.tools import TOOLS_SHAPE
from expert_cli.errors import UserError
from expert_cli.train.prompt_format import PromptFormat

TOOL = {"type": "function", "function": {"name": "lookup_order", "description": "Finds orders."}}
WITH_TOOLS = (
    "{%- if tools %}{{ '<|im_start|>system\\n' }}{%- for t in tools %}{{ t.function.name }}: "
    "{{ t.function.description + '\\n' }}{%- endfor %}{{ '<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_a_chat_prompt_is_rendered_with_the_tools(tiny_tokenizer) -> None:
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = WITH_TOOLS
    chat = PromptFormat("messages")
    asked = tok.decode(chat.render(tok, "Where is order 7?", None, [TOOL]))
    assert asked == (
        "<|im_start|>system\nlookup_order: Finds orders.\n<|im_end|>\n"
        "<|im_start|>user\nWhere is order 7?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert "lookup_order" not in tok.decode(chat.render(tok, "Where is order 7?"))
    tok.chat_template = WITH_TOOLS.replace("{%- if tools %}", "{%- if false %}")
    with pytest.raises(UserError, match="--tools: the run's chat template does not write tool"):
        chat.render(tok, "Where is order 7?", None, [TOOL])
    with pytest.raises(UserError, match="--tools: the run trained on prompts laid out without"):
        PromptFormat("chatml").render(tok, "Where is order 7?", None, [TOOL])


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("[{", f"is text that is not JSON; expected {TOOLS_SHAPE}"),
        ("[]", f"holds none; expected {TOOLS_SHAPE}"),
        ('{"name": "f"}', f"is an object, expected {TOOLS_SHAPE}"),
        ('["f"]', "item 0 is text that is not JSON, expected an object (a tool's"),
        ('[{"name": "\\ud800"}]', "holds a lone surrogate escape; not text"),
        (None, "does not exist"),
    ],
)
def test_tools_that_are_not_definitions_are_exit_2(
    capsys, monkeypatch, tmp_path: Path, content: str | None, expected: str
) -> None:
    """Checked before any run or model loads; the file's text is never quoted."""
    path = tmp_path / "tools.json"
    if content is not None:
        path.write_text(content)
    args = ["generate", "--adapter", str(tmp_path / "no-run"), "-p", "q", "--tools", str(path)]
    code, out, err = run_main(capsys, monkeypatch, *args)
    assert code == 2, out + err
    assert f"--tools {path}: {expected}" in " ".join(err.split())


def test_tools_go_with_prompts_given(capsys, monkeypatch, tmp_path: Path) -> None:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps([TOOL]))
    args = ["generate", "--adapter", str(tmp_path), "--eval", "2", "--tools", str(path)]
    code, _, err = run_main(capsys, monkeypatch, *args)
    assert code == 2
    assert "--tools: goes with --prompt or --prompts (--eval's have their own)" in err
