"""A base model folder whose tokenizer files are damaged or missing: `check` and `train` say so
in the same words (exit 2, no traceback, nothing written). transformers 5 builds an *empty*
tokenizer from a folder without vocabulary files, which used to train on nothing but the end
token (or, with ChatML data, to drop every example as having no completion)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from train_helpers import run_here, write_expert


def _cut(folder: Path) -> None:
    data = (folder / "tokenizer.json").read_bytes()
    (folder / "tokenizer.json").write_bytes(data[: len(data) // 3])


def _not_utf8(folder: Path) -> None:
    (folder / "tokenizer.json").write_bytes(b"\x00\xff not a tokenizer")


def _wrong_shape(folder: Path) -> None:
    (folder / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"vocab": 5}}))


def _gone(folder: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()


def _json_gone(folder: Path) -> None:  # tokenizer_config.json left: it read "damaged"
    (folder / "tokenizer.json").unlink()


def _no_eos(folder: Path) -> None:
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["eos_token"] = config["pad_token"] = None
    path.write_text(json.dumps(config))


def _foreign_eos(folder: Path) -> None:  # named, but no token of the vocabulary
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["eos_token"] = "<|not-in-the-vocabulary|>"
    path.write_text(json.dumps(config))


CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "cut short": (_cut, "are damaged (JSONDecodeError while reading them)"),
    "not UTF-8": (_not_utf8, "are damaged (UnicodeDecodeError while reading them)"),
    "wrong structure": (_wrong_shape, "are damaged (KeyError while reading them)"),
    "missing": (_gone, "has 1 token: its vocabulary files"),
    "tokenizer.json missing": (_json_gone, "has no tokenizer.json (nor vocab.json"),
    "no end token": (_no_eos, "has no EOS token"),
    # transformers added it as a new, untrained token and check said usable
    "an end token not in the vocabulary": (_foreign_eos, "is not in its vocabulary"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_check_and_train_name_the_tokenizer(
    case: str, tmp_path: Path, tiny_model_dir: Path
) -> None:
    damage, expected = CASES[case]
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    damage(model)
    manifest = write_expert(tmp_path / "expert", model, rows=8)

    check = run_here("check", "--manifest", str(manifest))
    said = " ".join(check.stdout.split())  # rich wraps long lines
    assert "base_models[0].name: the" in said and expected in said
    assert "manifest is not usable" in said

    proc = run_here("train", "--manifest", str(manifest))
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, text
    assert expected in text and "Traceback" not in text
    assert "not a tokenizer" not in text  # the file's bytes are never quoted
    assert "not-in-the-vocabulary" not in text
    assert sorted(p.name for p in manifest.parent.iterdir()) == ["data", "manifest.json"]


def _messages_expert(tmp_path: Path, model: Path) -> Path:
    manifest = write_expert(tmp_path / "expert", model, rows=4)
    rows = [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]}
        for i in range(8)
    ]
    lines = "\n".join(json.dumps(r) for r in rows) + "\n"
    (manifest.parent / "data" / "train.jsonl").write_text(lines)
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["field_mapping"] = {"messages": "messages"}
    manifest.write_text(json.dumps(data))
    return manifest


PLAIN_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (None, "field_mapping.messages: the tokenizer has no chat template"),
        (PLAIN_TEMPLATE, "response_template: the chat template renders no assistant marker"),
    ],
)
def test_messages_data_needs_a_chat_template_that_marks_replies(
    template: str | None, expected: str, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """check says what the build would refuse (it said usable, and train refused)."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "chat_template.jinja").unlink()
    if template is not None:
        (model / "chat_template.jinja").write_text(template)
    manifest = _messages_expert(tmp_path, model)
    said = " ".join(run_here("check", "--manifest", str(manifest)).stdout.split())
    assert expected in said and "manifest is not usable" in said
    proc = run_here("train", "--manifest", str(manifest))
    assert proc.returncode == 2
    assert expected in " ".join((proc.stdout + proc.stderr).split())
    assert not (manifest.parent / "output").exists()


def test_a_chat_template_that_does_not_parse(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A template with a syntax error (or one that raises): check was a jinja2 traceback;
    both commands now name the field and the kind of error, not the template's text."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "chat_template.jinja").write_text("{% for m in messages %}{{ SECRET ")
    manifest = _messages_expert(tmp_path, model)
    expected = "the tokenizer's chat template cannot render a conversation (TemplateSyntaxError)"
    check = run_here("check", "--manifest", str(manifest))
    said = " ".join(check.stdout.split())
    assert expected in said and "SECRET" not in said and "Traceback" not in said
    proc = run_here("train", "--manifest", str(manifest))
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2 and expected in text and "SECRET" not in text


ALTERNATING = (
    "{%- for m in messages %}{%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('SECRET roles must alternate') }}{%- endif %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}"
)


def _refusing_expert(tmp_path: Path, tiny_model_dir: Path, refused: list[int]) -> Path:
    """Ten conversations for a template that refuses roles that do not alternate; the rows
    numbered in `refused` open with a system turn."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "chat_template.jinja").write_text(ALTERNATING)
    manifest = _messages_expert(tmp_path, model)
    turns = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a b"}]
    rows = [
        {"messages": ([{"role": "system", "content": "s"}] if i in refused else []) + turns}
        for i in range(10)
    ]
    (manifest.parent / "data" / "train.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows)
    )
    return manifest


def test_held_out_examples_all_refused_fail_in_check_as_in_the_build(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The one conversation held out for evaluation (eval_fraction) is refused by the chat
    template: check said usable, then the build stopped on an evaluation split of none."""
    from expert_cli.config import load_manifest
    from expert_cli.config.environment import cpu_environment
    from expert_cli.config.resolve import resolve
    from expert_cli.data import prepare_data
    from expert_cli.data.checks import check_manifest
    from expert_cli.data.splits import held_rows
    from expert_cli.data.tokenizer import load_tokenizer
    from expert_cli.errors import UserError

    def expert(folder: Path, refused: list[int]) -> Path:
        manifest = _refusing_expert(folder, tiny_model_dir, refused)
        data = json.loads(manifest.read_text())
        del data["training"]["config"]["evaluation_strategy"]  # on: eval_fraction holds out
        manifest.write_text(json.dumps(data))
        return manifest

    resolved = resolve(load_manifest(expert(tmp_path / "a", [])), cpu_environment())
    held = [int(i) for i in held_rows(10, resolved.eval_fraction, resolved.eval_seed)]
    assert len(held) == 1
    other = next(i for i in range(10) if i not in held)
    assert check_manifest(expert(tmp_path / "b", [other])).problems == []  # a training one
    manifest = expert(tmp_path / "c", held)
    expected = (
        "training.dataset.eval_fraction (the held-out examples): no evaluation example is "
        "left after formatting (1 read, every one dropped: 1 refused by the chat template or "
        "with no assistant turn (the first: TemplateError, roles system, user, assistant))"
    )
    assert check_manifest(manifest).problems == [expected]
    resolved = resolve(load_manifest(manifest), cpu_environment())
    with pytest.raises(UserError) as built:
        prepare_data(resolved, load_tokenizer(resolved), num_proc=1)
    assert str(built.value) == expected
    assert check_manifest(manifest, quick=5).problems == []  # not read whole: not known


BY_TEXT = (
    "{%- for m in messages %}{%- if 'forbidden' in m['content'] %}"
    "{{ raise_exception('SECRET no such word') }}{%- endif %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}"
)


def test_a_template_that_refuses_by_text_is_no_false_alarm_for_the_held_out(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The template's verdict is remembered by a conversation's shape: one refused for its
    text made every held-out conversation of that shape look refused, and check was exit 2
    where the build kept them. Small data is formatted exactly."""
    from expert_cli.config import load_manifest
    from expert_cli.config.environment import cpu_environment
    from expert_cli.config.resolve import resolve
    from expert_cli.data import prepare_data
    from expert_cli.data.checks import check_manifest
    from expert_cli.data.splits import held_rows
    from expert_cli.data.tokenizer import load_tokenizer

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "chat_template.jinja").write_text(BY_TEXT)
    manifest = _messages_expert(tmp_path, model)
    data = json.loads(manifest.read_text())
    del data["training"]["config"]["evaluation_strategy"]  # on: eval_fraction holds out
    manifest.write_text(json.dumps(data))
    resolved = resolve(load_manifest(manifest), cpu_environment())
    held = set(held_rows(8, resolved.eval_fraction, resolved.eval_seed).tolist())
    system = [{"role": "system", "content": "s"}]
    rows = [
        {
            "messages": ([] if i in held or i == 0 else system)
            + [
                {"role": "user", "content": "forbidden" if i == 0 else f"q{i}"},
                {"role": "assistant", "content": "a b"},
            ]
        }
        for i in range(8)
    ]
    assert 0 not in held
    (manifest.parent / "data" / "train.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows)
    )
    assert check_manifest(manifest).problems == []
    built = prepare_data(resolved, load_tokenizer(resolved), num_proc=1)
    assert built.stats["eval"]["rows"] >= 1 and built.stats["train"]["dropped_template"] == 1


def test_a_saved_dataset_is_checked_row_by_row_as_a_file_is(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A save_to_disk copy of the same conversations was checked by column only: no word of
    the two the chat template refuses, and none of an empty answer, until train dropped them."""
    import datasets

    from expert_cli.data.checks import check_manifest

    manifest = _refusing_expert(tmp_path, tiny_model_dir, refused=[3, 6])
    rows = [json.loads(line) for line in (manifest.parent / "data" / "train.jsonl").open()]
    rows[8]["messages"][-1]["content"] = " "
    datasets.Dataset.from_list(rows).save_to_disk(manifest.parent / "data" / "saved")
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["path"] = "data/saved"
    manifest.write_text(json.dumps(data))
    report = check_manifest(manifest)
    saved = manifest.parent / "data" / "saved"
    assert report.problems == [] and report.rows_checked == {str(saved): 10}
    assert (
        f"{saved}: row 4: this conversation is refused by the tokenizer's chat template "
        "(TemplateError, roles system, user, assistant); 2 of 10 conversations are refused and "
        "train drops them"
    ) in " ".join(report.notes)
    assert (
        "training.dataset: 1 of 10 training examples read have an empty text, response or "
        "assistant turn; train drops them (no completion tokens)"
    ) in report.notes


def test_a_saved_dataset_of_renamed_columns_is_checked_row_by_row(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Columns read under another name (`output` as the response) were selected by their
    names after being renamed to their roles: check stopped in a ValueError traceback."""
    import datasets

    from expert_cli.data.checks import check_manifest

    rows = [{"instruction": f"q{i}", "output": f"a{i}" if i != 2 else " "} for i in range(6)]
    datasets.Dataset.from_list(rows).save_to_disk(tmp_path / "saved")
    for mapping in (None, {"instruction": "instruction", "response": "output"}):
        manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=4)
        data = json.loads(manifest.read_text())
        data["training"]["dataset"] = {"path": str(tmp_path / "saved")}
        if mapping:
            data["training"]["dataset"]["field_mapping"] = mapping
        manifest.write_text(json.dumps(data))
        report = check_manifest(manifest)
        assert report.problems == [], report.problems
        assert (
            "training.dataset: 1 of 6 training examples read have an empty text, response or "
            "assistant turn; train drops them (no completion tokens)"
        ) in report.notes


def test_conversations_the_chat_template_refuses_are_dropped_and_named(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The build stopped in a jinja traceback at the first conversation the template refused
    (raise_exception). check names the first one by file and line; train drops them, counts
    them and trains on the rest; the template's own message is never shown."""
    manifest = _refusing_expert(tmp_path, tiny_model_dir, refused=[3, 6])
    check = run_here("check", "--manifest", str(manifest))
    said = " ".join(check.stdout.split())
    assert check.returncode == 0 and "manifest is usable" in said
    assert (
        "train.jsonl:4: this conversation is refused by the tokenizer's chat template "
        "(TemplateError, roles system, user, assistant); 2 of 10 conversations are refused and "
        "train drops them"
    ) in said
    built = run_here("pretokenize", "--manifest", str(manifest))
    assert built.returncode == 0
    assert "dropped: 2 refused by the chat template or with no assistant turn" in " ".join(
        built.stdout.split()
    )
    proc = run_here("train", "--manifest", str(manifest))  # reads that cache, says the same
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 0, text
    assert (
        "dropped 2 refused by the chat template or with no assistant turn (the first: "
        "TemplateError, roles system"
    ) in text
    assert "SECRET" not in text + said and "Traceback" not in text
    (stats,) = (manifest.parent / ".cache" / "pretokenized").glob("*/stats.json")
    train = json.loads(stats.read_text())["train"]
    assert (train["examples"], train["kept"], train["dropped"]) == (10, 8, 2)
    assert train["dropped_template"] == 2


@pytest.mark.parametrize("validation", [False, True])
def test_a_template_that_refuses_every_conversation(
    validation: bool, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Every training conversation refused is a problem for check, whatever the validation
    file holds (check counted both together and said usable)."""
    manifest = _refusing_expert(tmp_path, tiny_model_dir, refused=list(range(10)))
    if validation:
        good = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
        (manifest.parent / "data" / "valid.jsonl").write_text(json.dumps({"messages": good}) + "\n")
        data = json.loads(manifest.read_text())
        data["training"]["dataset"]["validation_path"] = "data/valid.jsonl"
        manifest.write_text(json.dumps(data))
    check = run_here("check", "--manifest", str(manifest))
    said = " ".join(check.stdout.split())
    assert "it refuses every one of the 10 training conversations, so train would have" in said
    assert "manifest is not usable" in said
    proc = run_here("train", "--manifest", str(manifest))
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, text
    assert (
        "no training example is left after formatting (10 read, every one dropped: 10 refused "
        "by the chat template or with no assistant turn (the first: TemplateError, roles "
        "system, user, assistant))"
    ) in text
    assert not (manifest.parent / "output").exists() and "SECRET" not in text


def test_check_renders_each_shape_of_conversation_once(
    tmp_path: Path, tiny_model_dir: Path, tiny_tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A million conversations made check a minute slower; templates refuse by shape (roles
    and keys), so each shape is rendered once and its verdict stands for the others."""
    import copy

    from expert_cli.config import load_manifest
    from expert_cli.config.environment import cpu_environment
    from expert_cli.config.resolve import resolve
    from expert_cli.data.template_checks import template_verdict

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = ALTERNATING
    renders = []
    render = type(tok).apply_chat_template

    def counted(self, *args, **kwargs):
        renders.append(1)
        return render(self, *args, **kwargs)

    monkeypatch.setattr(type(tok), "apply_chat_template", counted)
    resolved = resolve(load_manifest(_messages_expert(tmp_path, tiny_model_dir)), cpu_environment())
    verdict = template_verdict(resolved, tok)
    setup = len(renders)  # the template's own sample, the probes of how it writes turns
    assert verdict is not None and 1 <= setup <= 24
    good = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    bad = [{"role": "system", "content": "s"}, *good]
    answers = [
        verdict({"messages": [dict(m, content=f"{i}") for m in (bad if i % 3 else good)]})
        for i in range(300)
    ]
    assert len(renders) == setup + 2  # one per shape
    assert answers.count(None) == 100
    assert set(answers) == {None, "TemplateError, roles system, user, assistant"}
    verdict({"messages": [*good, {"role": "user", "content": "x", "name": "n"}]})  # a new shape
    assert len(renders) == setup + 3
    call = {"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}
    from expert_cli.data.conversations import conversation_shape

    # a turn that only calls tools is its own shape: the template may leave its calls out
    assert conversation_shape([{**call, "content": ""}]) != conversation_shape(
        [{**call, "content": "Let me look."}]
    )


KEYED = (
    "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{%- if m.reasoning_content is defined %}<think>{{ m.reasoning_content }}</think>{% endif %}"
    "{{ m['content'] }}{%- if m.tool_calls is defined %}{% for t in m.tool_calls %}"
    "<call {{ t.function.name }}>{% endfor %}{% endif %}{{ '<|im_end|>\\n' }}{%- endfor %}"
)


def test_every_key_of_a_local_message_reaches_the_chat_template(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A local file's messages were written to Arrow with role and content only: a Qwen3
    thinking trace in `reasoning_content` or a tool call in `tool_calls` was silently left
    out of what was trained. Mixed with a saved dataset's conversations (an Arrow struct with
    null-filled keys), both render as their files wrote them."""
    import datasets

    from expert_cli.config import load_manifest
    from expert_cli.config.environment import cpu_environment
    from expert_cli.config.resolve import resolve
    from expert_cli.data import prepare_data
    from expert_cli.data.tokenizer import load_tokenizer

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "chat_template.jinja").write_text(KEYED)
    manifest = _messages_expert(tmp_path, model)
    user = {"role": "user", "content": "q"}
    call = {"type": "function", "function": {"name": "lookup", "arguments": {"k": 1}}}
    local = [
        {"messages": [user, {"role": "assistant", "content": "a", "reasoning_content": "r"}]},
        {"messages": [user, {"role": "assistant", "content": "b", "tool_calls": [call]}]},
        # OpenAI's form of a turn that only calls a tool: content null; an SDK dump's explicit
        # "tool_calls": null on the user turn is absent for the template
        {
            "messages": [
                {**user, "tool_calls": None},
                {"role": "assistant", "content": None, "tool_calls": [call]},
            ]
        },
    ]
    (manifest.parent / "data" / "train.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in local)
    )
    saved = [{"messages": [user, {"role": "assistant", "content": "c", "name": None}]}]
    datasets.Dataset.from_list(saved).save_to_disk(str(tmp_path / "saved"))
    data = json.loads(manifest.read_text())
    data["training"]["dataset"] = {
        "type": "multi_task",
        "tasks": {
            "local": {"train": "data/train.jsonl"},
            "saved": {"train": str(tmp_path / "saved")},
        },
        "field_mapping": {"messages": "messages"},
        "eval_fraction": 0.0,
    }
    data["training"]["config"]["packing"] = False
    manifest.write_text(json.dumps(data))
    resolved = resolve(load_manifest(manifest), cpu_environment())
    tokenizer = load_tokenizer(resolved)
    before = sorted(p.name for p in (tmp_path / "saved").iterdir())
    prepared = prepare_data(resolved, tokenizer, num_proc=1)
    # the saved folder is the user's: nothing is written beside it, so its fingerprint holds
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == before
    assert prepare_data(resolved, tokenizer, num_proc=1).status == "current"
    trained = sorted(
        tokenizer.decode([i for i, lab in zip(ids, labels, strict=True) if lab != -100])
        for ids, labels in zip(prepared.train["input_ids"], prepared.train["labels"], strict=True)
    )
    assert trained == [
        "<call lookup><|im_end|><|endoftext|>",
        "<think>r</think>a<|im_end|><|endoftext|>",
        "b<call lookup><|im_end|><|endoftext|>",
        "c<|im_end|><|endoftext|>",
    ]


def test_a_lone_surrogate_in_any_key_of_a_message(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Every key now reaches Arrow and the template: a `\\ud800` escape in reasoning_content
    was a UnicodeEncodeError traceback in the build while check said usable."""
    manifest = _messages_expert(tmp_path, tiny_model_dir)
    row = (
        '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", '
        '"tool_calls": [{"function": {"name": "f", "arguments": "\\ud800"}}]}]}\n'
    )
    (manifest.parent / "data" / "train.jsonl").write_text(row)
    expected = (
        "train.jsonl:1: field 'messages' (field_mapping.messages) item 1: "
        "tool_calls[0].function.arguments contains a lone surrogate at character 0"
    )
    check = run_here("check", "--manifest", str(manifest))
    assert expected in " ".join(check.stdout.split()) and check.returncode == 2
    proc = run_here("train", "--manifest", str(manifest))
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2 and expected in text and "Traceback" not in text


def test_content_given_as_text_parts(tmp_path: Path, tiny_model_dir: Path) -> None:
    """OpenAI's content parts (`[{"type": "text", "text": ...}]`) were exit 2 ("content is a
    list"); text parts are joined into one text, as multimodal templates render them, and a
    part that is not text (an image) is exit 2 naming the row and the part."""
    from expert_cli.config import load_manifest
    from expert_cli.config.environment import cpu_environment
    from expert_cli.config.resolve import resolve
    from expert_cli.data import prepare_data
    from expert_cli.data.tokenizer import load_tokenizer

    manifest = _messages_expert(tmp_path, tiny_model_dir)
    parts = [{"type": "text", "text": "SELECT "}, {"type": "text", "text": "1;"}]
    row = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": parts}]}
    (manifest.parent / "data" / "train.jsonl").write_text(json.dumps(row) + "\n")
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["eval_fraction"] = 0.0
    manifest.write_text(json.dumps(data))
    resolved = resolve(load_manifest(manifest), cpu_environment())
    tokenizer = load_tokenizer(resolved)
    prepared = prepare_data(resolved, tokenizer, num_proc=1)
    ids, labels = prepared.train["input_ids"][0], prepared.train["labels"][0]
    trained = [i for i, label in zip(ids, labels, strict=True) if label != -100]
    assert tokenizer.decode(trained) == "SELECT 1;<|im_end|><|endoftext|>"

    image = {"type": "image_url", "image_url": {"url": "data:SECRET"}}
    row["messages"][1]["content"] = [parts[0], image]
    (manifest.parent / "data" / "train.jsonl").write_text(json.dumps(row) + "\n")
    check = run_here("check", "--manifest", str(manifest))
    said = " ".join(check.stdout.split())
    assert check.returncode == 2 and "SECRET" not in said
    assert (
        "train.jsonl:1: field 'messages' (field_mapping.messages) item 1: content part 1 is of "
        "type 'image_url', expected a text part"
    ) in said
    # a part that says it is not text is refused, whatever else it holds
    row["messages"][1]["content"] = [parts[0], {"type": "image_url", "text": "x"}]
    (manifest.parent / "data" / "train.jsonl").write_text(json.dumps(row) + "\n")
    check = run_here("check", "--manifest", str(manifest))
    assert check.returncode == 2 and "content part 1 is of type 'image_url'" in " ".join(
        check.stdout.split()
    )
    # a text part of no text was "of type 'text', expected a text part"
    row["messages"][1]["content"] = [parts[0], {"type": "text", "text": None}]
    (manifest.parent / "data" / "train.jsonl").write_text(json.dumps(row) + "\n")
    check = run_here("check", "--manifest", str(manifest))
    said = " ".join(check.stdout.split())
    assert (
        check.returncode == 2 and "content part 1: its text is missing (null), expected a " in said
    )


def test_check_judges_a_tool_turn_by_its_joined_text() -> None:
    """check keyed its verdicts by the raw conversation, where text parts are a list: a tool
    turn with empty parts and one with text shared a verdict the build does not share."""
    from expert_cli.data.conversations import conversation_shape, without_fill_ins

    call = {"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}
    empty = [{**call, "content": [{"type": "text", "text": ""}]}]
    spoken = [{**call, "content": [{"type": "text", "text": "hi"}]}]
    assert conversation_shape(without_fill_ins(empty)) != conversation_shape(
        without_fill_ins(spoken)
    )
