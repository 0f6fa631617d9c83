"""`generate` lays out a prompt as the run's data laid out its prompts: the build records the
data's kind (detected where field_mapping is unset) and the layouts of its text examples, and
a run trained on `<|user|>`/`<|assistant|>` text answers a bare prompt as it was taught."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from conftest import R1_TEMPLATE, TINY_TOKENIZER_DIR, write_jsonl
from train_helpers import run_here

from expert_cli.config import load_manifest
from expert_cli.config.environment import cpu_environment
from expert_cli.config.resolve import resolve
from expert_cli.data import prepare_data
from expert_cli.data.tokenizer import load_tokenizer
from expert_cli.errors import UserError
from expert_cli.train.generate import _Streamer
from expert_cli.train.prompt_format import PromptFormat, prompt_format
from expert_cli.train.tokenizer_files import layout_stops

QUESTION, ANSWER = "Count the orders.", "SELECT COUNT(*) FROM orders;"
CHATML = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
MARKER = "<|user|>\nQ<|end|>\n<|assistant|>\nA<|end|>"


def _manifest(folder: Path, rows: list[dict], dataset: dict | None = None) -> Path:
    write_jsonl(folder / "train.jsonl", rows)
    manifest = {
        "name": "e",
        "schema_version": "2.0",
        "base_models": [{"name": str(TINY_TOKENIZER_DIR), "init": "random"}],
        "training": {
            "dataset": {"path": "train.jsonl", "eval_fraction": 0.0, **(dataset or {})},
            "config": {"evaluation_strategy": "no", "max_seq_length": 64},
        },
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder / "manifest.json"


def _prepared(manifest: Path):
    resolved = resolve(load_manifest(manifest), cpu_environment())
    tokenizer = load_tokenizer(resolved)
    return resolved, tokenizer, prepare_data(resolved, tokenizer, num_proc=1)


def test_the_build_records_the_detected_kind_and_each_layout(tmp_path: Path) -> None:
    rows = [{"text": CHATML}] * 3 + [{"text": MARKER}] * 2 + [{"text": "plain words"}]
    rows.append({"text": CHATML.replace("\nA<", "\n<")})  # an empty answer: dropped
    rows.append({"text": MARKER.replace("<|end|>", "</s>")})  # Zephyr's turns end with </s>
    rows.append({"text": "<|user|>\nQ\n<|assistant|>\nA <s>struck</s>"})  # not a turn's end
    resolved, tokenizer, data = _prepared(_manifest(tmp_path, rows))
    assert data.stats["fields"] == {
        "kind": "text",
        "mapping": {"text": "text"},
        "sources": [{"source": "training.dataset.path", "mapping": {"text": "text"}}],
    }
    assert data.stats["train"]["styles"] == {"chatml": 3, "marker": 3, "marker_eos": 1, "none": 1}
    assert data.stats["train"]["dropped_no_completion"] == 1
    layout, notes = prompt_format(resolved, tokenizer, {"stats": data.stats})
    assert layout == PromptFormat("chatml") and notes == []
    (tmp_path / "qa").mkdir()
    rows = [{"prompt": "Q", "completion": "A"}] * 4
    resolved, tokenizer, data = _prepared(_manifest(tmp_path / "qa", rows))
    assert data.stats["fields"]["mapping"] == {
        "instruction": "prompt",
        "response": "completion",
        "input": "input",  # detected: read in the rows that have one
        "system": "system",
    }
    assert data.stats["train"]["styles"] == {"template": 4}
    layout, notes = prompt_format(resolved, tokenizer, {"stats": data.stats})
    assert layout == PromptFormat("instruction", "chatml") and notes == []


def _layout(tmp_path: Path, stats: dict | None, dataset: dict | None = None):
    resolved = resolve(
        load_manifest(_manifest(tmp_path, [{"text": "x"}], dataset)), cpu_environment()
    )
    tokenizer = load_tokenizer(resolved)
    record = None if stats is None else {"stats": stats}
    return (*prompt_format(resolved, tokenizer, record), tokenizer)


def _text(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids)


def test_text_prompts_follow_the_layout_most_examples_had(tmp_path: Path) -> None:
    fields = {"kind": "text", "mapping": {"text": "text"}}
    stats = {"fields": fields, "train": {"styles": {"chatml": 2, "marker": 5, "none": 1}}}
    layout, notes, tok = _layout(tmp_path, stats)
    assert layout.style == "marker" and notes == []
    assert _text(tok, layout.render(tok, "Hi")) == "<|user|>\nHi<|end|>\n<|assistant|>\n"
    given = "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n"
    assert _text(tok, layout.render(tok, given)) == given  # the whole layout: as written
    assert _text(tok, layout.render(tok, "<|user|>\nHi")) == "<|user|>\nHi"  # not wrapped twice
    stats["train"]["styles"] = {"none": 4, "chatml": 1}
    layout, notes, tok = _layout(tmp_path, stats)
    assert _text(tok, layout.render(tok, "Once upon")) == "Once upon"
    assert notes and "continued as written" in notes[0]
    layout, notes, tok = _layout(tmp_path, {"fields": fields, "train": {"styles": {}}})
    assert layout.style == "chatml" and "does not record how" in notes[0]
    chat = _text(tok, layout.render(tok, "Hi"))
    assert chat == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_a_response_template_follows_the_prompt_once(tmp_path: Path) -> None:
    dataset = {"response_template": "### Answer:", "field_mapping": {"text": "text"}}
    layout, notes, tok = _layout(tmp_path, None, dataset)
    assert layout == PromptFormat("template", "### Answer:")
    assert "response_template" in notes[0]
    assert _text(tok, layout.render(tok, "Q: 2+2?\n")) == "Q: 2+2?\n### Answer:"
    assert _text(tok, layout.render(tok, "Q: 2+2?\n### Answer:")) == "Q: 2+2?\n### Answer:"
    # a space ending the template belongs to the answer's first token, as in training
    spaced = PromptFormat("template", "### Answer: ")
    assert _text(tok, spaced.render(tok, "Q: 2+2?\n")) == "Q: 2+2?\n### Answer:"
    # a newline ending it stays: training's prompt ended with it (":\n" is one Qwen token, and
    # generate's prompt ended ":", a token the adapter never saw there)
    lined = PromptFormat("template", "### Response:\n")
    assert _text(tok, lined.render(tok, "Q: 2+2?\n")) == "Q: 2+2?\n### Response:\n"
    trained = tok("Q: 2+2?\n### Response:\nSELECT 1", add_special_tokens=False).input_ids
    prompt = lined.render(tok, "Q: 2+2?\n")
    assert trained[: len(prompt)] == prompt and len(prompt) < len(trained)
    assert _text(tok, PromptFormat("template", "A:\n ").render(tok, "Q\n")) == "Q\nA:\n"


def test_an_unrecorded_kind_is_a_stated_guess(tmp_path: Path) -> None:
    layout, notes, tok = _layout(tmp_path, {"train": {}})  # field_mapping unset, no record
    assert layout.style == "messages" and "does not record its data's kind" in notes[0]
    assert _text(tok, layout.render(tok, "Hi")).endswith("<|im_start|>assistant\n")


def test_what_the_tokenizer_appends_after_a_prompt_is_left_off(tmp_path: Path) -> None:
    """A tokenizer whose special tokens add BOS and EOS around a text (as the build adds them
    to every example) keeps the BOS; the EOS would end the prompt before the answer."""
    from tokenizers.processors import TemplateProcessing

    tok = load_tokenizer(
        resolve(load_manifest(_manifest(tmp_path, [{"text": "x"}])), cpu_environment())
    )
    start, end = tok.convert_tokens_to_ids(["<|im_start|>", "<|endoftext|>"])
    tok.backend_tokenizer.post_processor = TemplateProcessing(
        single="<|im_start|> $A <|endoftext|>",
        special_tokens=[("<|im_start|>", start), ("<|endoftext|>", end)],
    )
    ids = PromptFormat("none").render(tok, "Once upon")
    plain = tok("Once upon", add_special_tokens=False)["input_ids"]
    assert tok("Once upon")["input_ids"] == [start, *plain, end]
    assert ids == [start, *plain]


@pytest.mark.slow
def test_a_run_on_marker_text_without_field_mapping_answers_a_bare_prompt(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Text data in `<|user|>`/`<|assistant|>` turns, its column found by name: `generate -p`
    wraps the prompt in those turns and the memorised answer comes back (it stopped with a
    traceback on the unset field_mapping, and a ChatML wrapping is a layout never trained)."""
    text = MARKER.replace("\nQ<", f"\n{QUESTION}<").replace("\nA<", f"\n{ANSWER}<")
    manifest = _manifest(tmp_path, [{"text": text}] * 32)
    data = json.loads(manifest.read_text())
    data["base_models"][0] = {"name": str(tiny_model_dir)}
    data["training"]["config"].update(
        {"learning_rate": 1e-2, "batch_size": 4, "packing": False, "warmup_steps": 0}
    )
    data["training"]["config"].update({"lr_scheduler": "constant", "save_steps": 1000})
    manifest.write_text(json.dumps(data))
    out = tmp_path / "out"
    done = run_here("train", "-m", str(manifest), "--output", str(out), "--max-steps", "60")
    assert done.returncode == 0, done.stdout + done.stderr
    said = run_here("generate", "--adapter", str(out), "-p", QUESTION, "--json", "--greedy")
    assert said.returncode == 0, said.stderr
    report = json.loads(said.stdout)
    assert report["generations"][0]["output"].startswith(ANSWER)
    assert report["settings"]["prompt_layout"].startswith("a <|user|> turn")


def test_a_system_turn_is_laid_out_as_the_datas(tmp_path: Path) -> None:
    """`--system` goes where the layout puts a system turn; a layout without one (whole
    texts, a response_template, a prompt holding its own markers) is exit 2, not guessed."""
    fields = {"kind": "text", "mapping": {"text": "text"}}
    layout, _, tok = _layout(tmp_path, {"fields": fields, "train": {"styles": {"chatml": 1}}})
    assert _text(tok, layout.render(tok, "Hi", "Be brief.")) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    marker = PromptFormat("marker")
    assert _text(tok, marker.render(tok, "Hi", "Be brief.")) == (
        "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n"
    )
    zephyr = PromptFormat("marker_eos")  # data ending its turns with </s>: prompted alike
    assert _text(tok, zephyr.render(tok, "Hi", "Be brief.")) == (
        "<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\n"
    )
    alpaca = _text(tok, PromptFormat("instruction", "alpaca").render(tok, "Hi", "Be brief."))
    assert alpaca.startswith("Be brief.\n\nBelow is an instruction")
    chat = _text(tok, PromptFormat("messages").render(tok, "Hi", "Be brief."))
    assert chat.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi")
    for kept, prompt in ((PromptFormat("none"), "Once"), (layout, "<|im_start|>user\nHi")):
        with pytest.raises(UserError, match="--system: the prompt is used as written"):
            kept.render(tok, prompt, "Be brief.")


def test_a_runs_recorded_mapping_is_read_for_its_kind_alone() -> None:
    """A run trained with `{"text": "text", "system": "sys"}` (accepted then) could not be
    tried: its mapping went through the manifest's check, which now refuses roles beside
    `text`."""
    from expert_cli.data.fields import mapping_kind

    assert mapping_kind({"text": "text", "system": "sys"}) == "text"
    assert mapping_kind({"messages": "m", "system": "s"}) == "messages"
    assert mapping_kind({"instruction": "q", "response": "a"}) == "instruction"


def test_each_layout_stops_at_its_turn_end_as_a_token_or_as_text(tiny_tokenizer) -> None:
    """The tiny tokenizer has `<|im_end|>` and `<|im_start|>` tokens but no `<|end|>`: ChatML
    stops are ids, the marker layout's are texts; instruction data in the chatml template stops
    as ChatML, other templates and whole texts at the EOS alone."""
    vocab = tiny_tokenizer.get_vocab()
    eos = tiny_tokenizer.eos_token_id
    chatml = layout_stops(tiny_tokenizer, PromptFormat("chatml").stops)
    assert chatml.texts == () and {vocab["<|im_end|>"], vocab["<|im_start|>"], eos} <= {*chatml.ids}
    assert layout_stops(tiny_tokenizer, PromptFormat("instruction", "chatml").stops) == chatml
    marker = layout_stops(tiny_tokenizer, PromptFormat("marker").stops)
    assert marker.texts == ("<|end|>", "<|user|>")
    assert layout_stops(tiny_tokenizer, PromptFormat("marker_eos").stops).texts == (
        "</s>",
        "<|user|>",
    )
    for plain in (PromptFormat("none"), PromptFormat("instruction", "alpaca")):
        assert layout_stops(tiny_tokenizer, plain.stops).texts == ()
    # the answer is cut before the first stop text; a piece that may begin one is held back
    assert marker.cut("SELECT 1;\n<|user|>\nQ<|end|>") == "SELECT 1;\n"
    assert marker.cut("a <| b") == "a <| b"
    assert [marker.held(t) for t in ("x<|e", "x<", "x<|u", "x|>", "x")] == [3, 1, 3, 0, 0]
    # a marker added as a token that is not special: a stop id, and cut where decoding keeps it
    added = copy.deepcopy(tiny_tokenizer)
    added.add_tokens(["<|end|>", "<|user|>"])
    stops = layout_stops(added, PromptFormat("marker").stops)
    assert stops.texts == () and added.convert_tokens_to_ids("<|end|>") in stops.ids
    assert stops.cut("SELECT 1;<|end|>\n<|user|>") == "SELECT 1;"


def test_the_stream_shows_nothing_of_a_stop_text(tiny_tokenizer) -> None:
    shown: list[str] = []

    class View:
        def text(self, piece: str) -> None:
            shown.append(piece)

    stops = layout_stops(tiny_tokenizer, PromptFormat("marker").stops)
    streamer = _Streamer(tiny_tokenizer, View(), stops)  # type: ignore[arg-type]
    for piece in ("SELECT ", "1;<|e", "nd|>\n", "<|user|>\nmore"):
        streamer.on_finalized_text(piece)
    streamer.on_finalized_text("", stream_end=True)
    assert "".join(shown) == "SELECT 1;"
    shown.clear()
    streamer = _Streamer(tiny_tokenizer, View(), stops)  # type: ignore[arg-type]
    streamer.on_finalized_text("a <")
    streamer.on_finalized_text("b> c", stream_end=True)  # "<" began no stop: shown at the end
    assert "".join(shown) == "a <b> c"


def test_a_prompt_ends_before_a_reasoning_opening_training_prompts_lacked(tmp_path: Path) -> None:
    """R1 distills' generation prompt ends with `<think>\\n`; the training conversations'
    answers followed `<｜Assistant｜>` alone (the template writes no answer after the opening),
    so generate lays the prompt out as trained, with a note."""
    stats = {"fields": {"kind": "messages"}, "train": {"styles": {"turns": 4}}}
    resolved = resolve(load_manifest(_manifest(tmp_path, [{"text": "x"}], {})), cpu_environment())
    tokenizer = load_tokenizer(resolved)
    tokenizer.chat_template = R1_TEMPLATE
    layout, notes = prompt_format(resolved, tokenizer, {"stats": stats})
    assert layout == PromptFormat("messages", opening="<think>\n")
    assert notes and "prompts end before the chat template's <think>" in notes[0]
    assert _text(tokenizer, layout.render(tokenizer, "Hi")).endswith("<｜User｜>Hi<｜Assistant｜>")
    assert "<think>" not in _text(tokenizer, layout.render(tokenizer, "Hi"))
