"""`base_models[0].chat_template`: a base without a chat template of its own (a base model,
not an instruct one) could not train `messages` data; the manifest now gives one, ChatML or
a Jinja file, which the run's saved tokenizer keeps for generate, merge and package."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
from conftest import write_jsonl
from train_helpers import run_here, without_chat_template, write_expert
from transformers import AutoTokenizer

from expert_cli.data.checks import check_manifest
from expert_cli.data.formatting import IGNORE

ROWS = [
    {
        "messages": [
            {"role": "user", "content": f"Add {i} and 2."},
            {"role": "assistant", "content": str(i + 2)},
        ]
    }  # fmt: skip
    for i in range(6)
]


def _bare_model(tmp_path: Path, tiny_model_dir: Path) -> Path:
    """The tiny model with its chat template taken away."""
    model = without_chat_template(tiny_model_dir, tmp_path)
    assert not AutoTokenizer.from_pretrained(model).chat_template
    return model


def _expert(tmp_path: Path, model: Path, template: str | None) -> Path:
    manifest = write_expert(tmp_path / "e", model, rows=1)
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["field_mapping"] = {"messages": "messages"}
    if template is not None:
        data["base_models"][0]["chat_template"] = template
    manifest.write_text(json.dumps(data))
    write_jsonl(manifest.parent / "data" / "train.jsonl", ROWS)
    return manifest


def test_a_base_without_a_chat_template_trains_conversations_with_the_manifests(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    model = _bare_model(tmp_path, tiny_model_dir)
    refused = run_here("check", "--manifest", str(_expert(tmp_path / "none", model, None)))
    said = " ".join((refused.stdout + refused.stderr).split())
    assert refused.returncode == 2 and 'set base_models[0].chat_template ("chatml"' in said
    manifest = _expert(tmp_path, model, "chatml")
    assert check_manifest(manifest).problems == []
    output = tmp_path / "run"
    proc = run_here("train", "--manifest", str(manifest), "--output", str(output),
                    "--max-steps", "1")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (train,) = (manifest.parent / ".cache").rglob("train")
    rows = datasets.load_from_disk(str(train))
    tok = AutoTokenizer.from_pretrained(model)
    whole = "".join(tok.decode(r) for r in rows["input_ids"])
    assert "<|im_start|>user\nAdd 3 and 2.<|im_end|>\n<|im_start|>assistant\n5<|im_end|>" in whole
    trained = "".join(
        tok.decode([i for i, lab in zip(ids, labels, strict=True) if lab != IGNORE])
        for ids, labels in zip(rows["input_ids"], rows["labels"], strict=True)
    )
    assert "5<|im_end|>" in trained and "Add" not in trained
    saved = AutoTokenizer.from_pretrained(output)  # what generate, merge and package read
    turn = [{"role": "user", "content": "hi"}]
    assert saved.apply_chat_template(turn, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_template_file_is_read_and_a_bad_one_named(tmp_path: Path, tiny_model_dir: Path) -> None:
    model = _bare_model(tmp_path, tiny_model_dir)
    manifest = _expert(tmp_path, model, "template.jinja")
    (manifest.parent / "template.jinja").write_text(
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}"
    )
    assert check_manifest(manifest).problems == []  # its answers found after its own prompt
    (manifest.parent / "template.jinja").write_bytes(b"\xff\xfe secret {{ x }}")
    bad = run_here("check", "--manifest", str(manifest))
    said = " ".join((bad.stdout + bad.stderr).split())
    assert bad.returncode == 2 and "template.jinja is not UTF-8 text" in said
    assert "secret" not in said and "Traceback" not in said
    gone = _expert(tmp_path / "gone", model, "missing.jinja")
    missing = run_here("check", "--manifest", str(gone))
    said = " ".join((missing.stdout + missing.stderr).split())
    assert missing.returncode == 2
    assert "base_models[0].chat_template:" in said and "missing.jinja is not a file" in said


def test_a_template_without_a_generation_prompt_is_asked_as_it_trained(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Found by a review: a template with no add_generation_prompt branch trained answers
    after `<|im_start|>assistant\\n` (the build finds ChatML's marker) or after the
    response_template, and generate asked without it. check says so; generate ends the
    prompt with what the answers followed."""
    from expert_cli.config import load_manifest
    from expert_cli.config.environment import cpu_environment
    from expert_cli.config.resolve import resolve
    from expert_cli.train.prompt_format import prompt_format

    model = without_chat_template(tiny_model_dir, tmp_path)
    chatml = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}"
    )
    headers = "{% for m in messages %}### {{ m['role'] }}:\n{{ m['content'] }}\n{% endfor %}"
    tok = AutoTokenizer.from_pretrained(model)
    for name, text, marker, ending in (
        ("chatml.jinja", chatml, None, "<|im_start|>assistant\n"),
        ("headers.jinja", headers, "### assistant:\n", "### assistant:\n"),
    ):
        manifest = _expert(tmp_path / name, model, name)
        (manifest.parent / name).write_text(text)
        if marker:
            data = json.loads(manifest.read_text())
            data["training"]["dataset"]["response_template"] = marker
            manifest.write_text(json.dumps(data))
        report = check_manifest(manifest)
        assert report.problems == []
        assert any("writes no generation prompt" in n and repr(ending.strip()) in n
                   for n in report.notes), report.notes  # fmt: skip
        tok.chat_template = text
        resolved = resolve(load_manifest(manifest), cpu_environment())
        layout, _ = prompt_format(resolved, tok, {"stats": {"fields": {"mapping": {
            "messages": "messages"}}}})  # fmt: skip
        prompt = tok.decode(layout.render(tok, "Add 9 and 2."))
        assert "Add 9 and 2." in prompt and prompt.endswith(ending)
        assert not tok.apply_chat_template(  # the template itself ends with the user's turn
            [{"role": "user", "content": "q"}], tokenize=False, add_generation_prompt=True
        ).endswith(ending)


def test_a_template_given_over_the_bases_own_is_said(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The tiny model has a ChatML template of its own: the manifest's replaces it, and the
    resolution says so; over a base without one it says nothing."""
    from expert_cli.config import load_manifest
    from expert_cli.config.environment import cpu_environment
    from expert_cli.config.resolve import resolve

    said = "base_models[0].chat_template: replaces the base model's own chat template"
    over = resolve(
        load_manifest(_expert(tmp_path / "a", tiny_model_dir, "chatml")), cpu_environment()
    )
    assert any(n.startswith(said) for n in over.notes)
    bare = without_chat_template(tiny_model_dir, tmp_path / "b")
    alone = resolve(load_manifest(_expert(tmp_path / "c", bare, "chatml")), cpu_environment())
    assert not any(n.startswith(said) for n in alone.notes)
    (bare / "additional_chat_templates").mkdir()  # named templates the tokenizer reads
    (bare / "additional_chat_templates" / "tool_use.jinja").write_text("{{ messages }}")
    named = resolve(load_manifest(_expert(tmp_path / "d", bare, "chatml")), cpu_environment())
    assert any(n.startswith(said) for n in named.notes)


def test_a_template_that_loops_without_end_is_refused_in_time(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch
) -> None:
    """A chat template of nested loops held check for hours: its first render is bounded
    (10 s; half a second here), and check names the file."""
    import time

    from expert_cli.data import tokenizer

    monkeypatch.setattr(tokenizer, "TEMPLATE_SECONDS", 0.5)
    template = tmp_path / "slow.jinja"
    template.write_text(
        "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
        "{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    began = time.monotonic()
    report = check_manifest(_expert(tmp_path, _bare_model(tmp_path, tiny_model_dir), str(template)))
    assert time.monotonic() - began < 30
    said = " ".join(report.problems)
    assert f"chat template (the file {template}) took over 0.5 s to render" in said, said


def test_a_template_file_that_is_not_jinja_is_refused_whatever_the_data(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Text data with a chat_template file cut short: check said usable, train shipped the
    file, and the merged model's template raised."""
    template = tmp_path / "cut.jinja"
    template.write_text("{% for m in messages %}{{ m.content ")
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=4)
    data = json.loads(manifest.read_text())
    data["base_models"][0]["chat_template"] = str(template)
    manifest.write_text(json.dumps(data))
    said = " ".join(check_manifest(manifest).problems)
    assert f"base_models[0].chat_template: {template} is not a Jinja template" in said, said
    # one that renders nothing: read as data without answers (check spoke of reasoning and
    # of response_template)
    template.write_text("{% for m in messages %}{% endfor %}")
    said = " ".join(check_manifest(manifest).problems)
    assert f"the chat template (the file {template}) renders nothing for a two-message" in said
    assert "response_template" not in said and "reasoning" not in said, said


def test_conversations_a_template_writes_nothing_for_are_refused_alike_by_check_and_build(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A template that writes nothing for conversations of seven messages and more: check
    called them conversations with earlier answers kept as context, the build dropped them
    as having no completion. Both say they are refused, the template writing no text."""
    template = tmp_path / "short.jinja"
    template.write_text(
        "{% if messages|length < 7 %}{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}"
        "<|im_start|>assistant\n{% endif %}{% endif %}"
    )
    manifest = _expert(tmp_path, _bare_model(tmp_path, tiny_model_dir), str(template))
    exchange = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    rows = [{"messages": exchange * (4 if i % 3 == 0 else 3)} for i in range(30)]
    write_jsonl(manifest.parent / "data" / "train.jsonl", rows)
    checked = run_here("check", "--manifest", str(manifest))
    said = " ".join((checked.stdout + checked.stderr).split())
    assert checked.returncode == 0, said
    assert "(it renders no text, roles user, assistant" in said, said
    assert "10 of 30 conversations are refused and train drops them" in said
    assert "left as context" not in said
    built = run_here("pretokenize", "--manifest", str(manifest))
    said = " ".join((built.stdout + built.stderr).split())
    assert built.returncode == 0, said
    assert (
        "10 refused by the chat template or with no assistant turn (the first: it renders "
        "no text" in said
    ), said
    # one that writes nothing by what a conversation says, not its shape: the first row's
    # render was taken for every row of its shape (check: "refuses every one of the 30")
    template.write_text(
        "{% if 'skip' not in messages[0].content %}{% for m in messages %}<|im_start|>"
        "{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}"
        "<|im_start|>assistant\n{% endif %}{% endif %}"
    )
    rows = [
        {"messages": [{"role": "user", "content": "skip" if i % 3 == 0 else "Hi"}, exchange[1]]}
        for i in range(30)
    ]
    write_jsonl(manifest.parent / "data" / "train.jsonl", rows)
    checked = run_here("check", "--manifest", str(manifest))
    said = " ".join((checked.stdout + checked.stderr).split())
    assert checked.returncode == 0, said
    assert "10 of 30 conversations are refused and train drops them" in said, said


def test_check_names_a_template_that_loops_on_a_later_row_of_a_seen_shape(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch
) -> None:
    """The template's verdict renders one conversation of each shape; one that loops only on
    what a later row of that shape says was met by check's formatting of the small data, whose
    bounded refusal was taken for a template that cannot render: check called it usable and
    train hung. It is exit 2 naming the loop."""
    import time

    from expert_cli.data import workers

    monkeypatch.setattr(workers, "TEMPLATE_SECONDS", 0.5)
    template = tmp_path / "loops.jinja"
    template.write_text(
        "{% for m in messages %}{% if 'slow' in m.content %}{% for a in range(100000) %}"
        "{% for b in range(100000) %}{% endfor %}{% endfor %}{% endif %}<|im_start|>"
        "{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}"
        "<|im_start|>assistant\n{% endif %}"
    )
    manifest = _expert(tmp_path, _bare_model(tmp_path, tiny_model_dir), str(template))
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"{word} {i}"},
                {"role": "assistant", "content": "ok"},
            ]
        }
        for i, word in enumerate(["quick"] * 5 + ["slow"] + ["quick"] * 4)
    ]
    write_jsonl(manifest.parent / "data" / "train.jsonl", rows)
    began = time.monotonic()
    proc = run_here("check", "--manifest", str(manifest))
    assert time.monotonic() - began < 60
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2 and "manifest is usable" not in said, said
    assert "the chat template took over 10 s to render a conversation (a loop without" in said


def test_a_deadline_bounds_the_main_thread_and_gives_back_an_outer_timer() -> None:
    import signal
    import threading

    import pytest

    from expert_cli.deadline import TimedOut, deadline

    handler, timer = signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL)
    try:  # pytest-timeout's own timer set aside for the test
        signal.setitimer(signal.ITIMER_REAL, 0)
        with pytest.raises(TimedOut), deadline(0.05) as bound:
            while True:
                pass
        assert bound.bounded and bound.expired
        with deadline(5) as bound:
            pass
        assert not bound.expired and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        assert signal.getsignal(signal.SIGALRM) is handler
        signal.setitimer(signal.ITIMER_REAL, 100)  # an outer timer goes on after
        with deadline(5):
            pass
        assert 99 < signal.getitimer(signal.ITIMER_REAL)[0] <= 100
    finally:
        signal.setitimer(signal.ITIMER_REAL, *timer)
    seen = []
    thread = threading.Thread(target=lambda: seen.append(deadline(1).__enter__().bounded))
    thread.start()
    thread.join()
    assert seen == [False]  # off the main thread it cannot bound, and says so


def test_a_package_names_its_own_copy_of_the_template(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The packaged manifest named the template by its path on the training machine
    (templates/chat.jinja), which the package does not hold: unpacked, it could not train
    again. It names the package's chat_template.jinja, the run's template, with a note."""
    import shutil
    import tarfile

    model = _bare_model(tmp_path, tiny_model_dir)
    manifest = _expert(tmp_path, model, "templates/chat.jinja")
    text = (
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}"
    )
    (manifest.parent / "templates").mkdir()
    (manifest.parent / "templates" / "chat.jinja").write_text(text)
    run = tmp_path / "run"
    done = run_here("train", "-m", str(manifest), "--output", str(run), "--max-steps", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    package = tmp_path / "x.expert"
    packed = run_here("package", "--adapter", str(run), "--output", str(package))
    assert packed.returncode == 0, packed.stdout + packed.stderr
    said = " ".join(packed.stdout.split())
    assert (
        "base_models[0].chat_template: templates/chat.jinja ships as the package's "
        "chat_template.jinja" in said
    ), said
    unpacked = tmp_path / "unpacked"
    with tarfile.open(package, "r:gz") as tar:
        tar.extractall(unpacked, filter="data")
    shipped = json.loads((unpacked / "manifest.json").read_text())
    assert shipped["base_models"][0]["chat_template"] == "chat_template.jinja"
    assert (unpacked / "chat_template.jinja").read_text() == text
    shutil.copytree(manifest.parent / "data", unpacked / "data")  # the data, as trained
    assert check_manifest(unpacked / "manifest.json").problems == []
    source = json.loads((run / "manifest.source.json").read_text())
    assert source["base_models"][0]["chat_template"] == "templates/chat.jinja"  # run's: as is


def test_a_template_that_loops_for_some_conversations_is_bounded(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch
) -> None:
    """A template that loops without end only for conversations of five messages or more
    passed the load's check (a two-message conversation) and the layout's (four) and held
    check and train for ever: each render of a row is bounded, and one past it is exit 2
    naming the template."""
    for module in ("conversations", "turns", "workers"):
        monkeypatch.setattr(f"expert_cli.data.{module}.TEMPLATE_SECONDS", 1)
    model = _bare_model(tmp_path, tiny_model_dir)
    manifest = _expert(tmp_path, model, "loops.jinja")
    (manifest.parent / "loops.jinja").write_text(
        "{% if messages|length > 4 %}{% for a in range(99999) %}{% for b in range(99999) %}"
        "{% endfor %}{% endfor %}{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    longer = {"messages": ROWS[0]["messages"] * 3}
    write_jsonl(manifest.parent / "data" / "train.jsonl", [*ROWS * 5, longer])  # past a batch
    said = "the chat template took over"
    checked = run_here("check", "--manifest", str(manifest))
    out = " ".join((checked.stdout + checked.stderr).split())
    assert checked.returncode == 2 and said in out and "loop without end" in out, out
    trained = run_here("train", "--manifest", str(manifest), "--output", str(tmp_path / "r"),
                       "--max-steps", "1")  # fmt: skip
    out = " ".join((trained.stdout + trained.stderr).split())
    assert trained.returncode == 2 and said in out, out
    assert not (tmp_path / "r").exists()
