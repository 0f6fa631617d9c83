"""Values `check` used to pass and a later command tripped over: `training.decoding` settings
out of bounds or of the wrong type, a grammar file that is not there, a `name` or `version`
that is no file name, lone surrogates and non-finite numbers anywhere in the manifest (metadata
and comments too: `package` writes them back). Each is a UserError naming the JSON path and
what is expected, at load time, so `check`, `train` and `package` refuse it alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from expert_cli.config import DecodingSpec, Manifest, load_manifest
from expert_cli.config.environment import Environment
from expert_cli.config.resolve import resolve
from expert_cli.errors import UserError
from expert_cli.paths import path_is_dir, resolved_path

ROOT = Path(__file__).resolve().parents[2]
SECRET = "QQsecretQQ"


def _data(**top) -> dict:
    data = {
        "name": "expert-e",
        "version": "0.1.0",
        "schema_version": "2.0",
        "base_models": [{"name": "org/model", "adapters": [{"type": "lora"}]}],
        "training": {"dataset": {"path": "train.jsonl"}},
    }
    decoding = top.pop("decoding", None)
    if decoding is not None:
        data["training"]["decoding"] = decoding
    return {**data, **top}


def _write(tmp_path: Path, data: dict | str) -> Path:
    (tmp_path / "train.jsonl").write_text('{"text": "x"}\n')
    path = tmp_path / "manifest.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def _error(tmp_path: Path, data: dict | str, overrides: list[str] | None = None) -> str:
    with pytest.raises(UserError) as err:
        load_manifest(_write(tmp_path, data), overrides)
    text = "\n".join(err.value.lines)
    assert SECRET not in text  # never the manifest's own text
    return text


# --------------------------------------------------------------------------- training.decoding


@pytest.mark.parametrize(
    ("decoding", "expected"),
    [
        ({"temperature": -1}, "training.decoding.temperature: Input should be greater than or"),
        ({"temperature": 2.5}, "training.decoding.temperature: Input should be less than or"),
        ({"temperature": "hot"}, "training.decoding.temperature: Input should be a valid number"),
        ({"temperature": True}, "training.decoding.temperature: Input should be a valid number"),
        ({"top_p": 2}, "training.decoding.top_p: Input should be less than or equal to 1"),
        ({"top_k": -5}, "training.decoding.top_k: Input should be greater than or equal to 1"),
        ({"top_k": 2.5}, "training.decoding.top_k: Input should be a valid integer"),
        ({"max_new_tokens": 10**12}, "training.decoding.max_new_tokens: Input should be less"),
        ({"max_tokens": 0}, "training.decoding.max_tokens: Input should be greater than or"),
        ({"repetition_penalty": 0}, "training.decoding.repetition_penalty: Input should be"),
        ({"min_p": 1.5}, "training.decoding.min_p: Input should be less than or equal to 1"),
        ({"use_grammar": "yes"}, "training.decoding.use_grammar: Input should be a valid bool"),
        ({"stop_sequences": ";"}, "training.decoding.stop_sequences: Input should be a valid"),
        ({"stop_sequences": [";"] * 65}, "training.decoding.stop_sequences: List should have"),
        ("not an object", "training.decoding: Input should be a valid dictionary"),
    ],
)
def test_decoding_values_are_bounded_and_typed(tmp_path: Path, decoding, expected: str) -> None:
    assert expected in _error(tmp_path, _data(decoding=decoding))


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_decoding_numbers_are_finite(tmp_path: Path, literal: str) -> None:
    text = json.dumps(_data(decoding={"temperature": 0.5})).replace("0.5", literal)
    assert "training.decoding.temperature: not a finite number" in _error(tmp_path, text)


def test_published_decoding_blocks_load_and_keep_their_extensions(tmp_path: Path) -> None:
    """hivellm/expert-sql's block (grammar_type, validation, stop_sequences, min_p), and a key
    the format does not name: kept, as the format allows."""
    decoding = {
        "use_grammar": True,
        "grammar_type": "sql-postgres",
        "validation": "parser-strict",
        "stop_sequences": [";", "\n\n"],
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
        "min_p": 0,
        "_comment": "kept out of the models",
        "beam_width": 4,
    }
    spec = load_manifest(_write(tmp_path, _data(decoding=decoding))).manifest.training.decoding
    assert isinstance(spec, DecodingSpec)
    assert (spec.temperature, spec.top_k, spec.stop_sequences) == (0.7, 20, [";", "\n\n"])
    assert spec.model_extra == {"beam_width": 4}
    for path in [*sorted((ROOT / "experts").glob("*/manifest.json")), ROOT / "tests/fixtures"]:
        for manifest in [path] if path.is_file() else sorted(path.glob("*.json")):
            Manifest.model_validate(json.loads(manifest.read_text(encoding="utf-8")))


def test_the_grammar_file_must_be_beside_the_manifest(tmp_path: Path) -> None:
    data = _data(decoding={"grammar_file": "grammars/sql.gbnf"})
    missing = tmp_path / "grammars" / "sql.gbnf"
    assert (
        f"manifest.json: training.decoding.grammar_file: {missing} is not a file; expected a "
        "grammar file, relative to the manifest's folder"
    ) in _error(tmp_path, data)
    missing.parent.mkdir()
    missing.mkdir()  # a folder is no grammar file either
    assert "training.decoding.grammar_file" in _error(tmp_path, data)
    missing.rmdir()
    missing.write_text('root ::= "SELECT"\n')
    assert load_manifest(_write(tmp_path, data)).manifest.training.decoding.grammar_file
    # through --set, the option is blamed
    text = _error(tmp_path, data, ["training.decoding.grammar_file=nope.gbnf"])
    assert text.startswith("--set training.decoding.grammar_file=nope.gbnf: training.decoding")


@pytest.mark.parametrize(
    "value",
    ["../grammar.gbnf", "a/../../g.gbnf", "/etc/passwd", "C:/g.gbnf", "\\\\host\\g", "", "g\x00"],
)
def test_the_grammar_file_stays_inside_the_expert(tmp_path: Path, value: str) -> None:
    text = _error(tmp_path, _data(decoding={"grammar_file": value}))
    assert (
        "training.decoding.grammar_file: expected a relative path inside the expert's folder"
    ) in text


# --------------------------------------------------------------------------- name, version


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", "../evil"),
        ("name", "a/b"),
        ("name", "a\\b"),
        ("name", "a\x00b"),
        ("name", "a\nb"),
        ("name", "a\x7fb"),
        ("name", ""),
        ("name", ".hidden"),
        ("name", "-rf"),
        ("name", "x" * 129),
        ("name", "ünïcode"),
        ("version", "1/2"),
        ("version", ".."),
        ("version", "1.0\t"),
    ],
)
def test_name_and_version_become_file_names_safely(tmp_path: Path, field: str, value: str) -> None:
    text = _error(tmp_path, _data(**{field: value}))
    assert (
        f"manifest.json: {field}: expected 1 to 128 ASCII letters, digits, '.', '_', '+' or '-'"
        in text
    )
    assert "starting with a letter or digit" in text


@pytest.mark.parametrize(
    ("name", "version"),
    [("expert-sql", "0.3.0"), ("e", "1"), ("Expert_v2.1", "1.0.0-rc.1+build.5"), ("x" * 128, "0")],
)
def test_real_names_still_pass(tmp_path: Path, name: str, version: str) -> None:
    manifest = load_manifest(_write(tmp_path, _data(name=name, version=version))).manifest
    assert (manifest.name, manifest.version) == (name, version)


# --------------------------------------------------------------------------- any string, any number


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        ('"description": "' + SECRET + '\\ud800"', "description"),
        ('"tags": ["ok", "\\udfff' + SECRET + '"]', "tags[1]"),
        ('"_comment": "\\ud800"', "_comment"),  # comments are written into packages too
        ('"routing": {"keywords": ["sql"], "router_hint": "\\udc00"}', "routing.router_hint"),
        ('"limitations": [{"pattern": "\\ud83d"}]', "limitations[0].pattern"),
    ],
)
def test_lone_surrogates_are_refused_anywhere(tmp_path: Path, raw: str, where: str) -> None:
    text = json.dumps(_data())[:-1] + ", " + raw + "}"
    assert f"manifest.json: {where}: contains a lone surrogate" in _error(tmp_path, text)


def test_a_lone_surrogate_in_a_key_names_its_block(tmp_path: Path) -> None:
    text = json.dumps(_data())[:-1] + ', "constraints": {"\\ud800": 1}}'
    assert "manifest.json: constraints: a key here contains a lone surrogate" in _error(
        tmp_path, text
    )


def test_a_surrogate_pair_is_text(tmp_path: Path) -> None:
    text = json.dumps(_data())[:-1] + ', "description": "SQL \\ud83d\\ude00"}'
    assert load_manifest(_write(tmp_path, text)).manifest.description == "SQL \U0001f600"


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        ('"constraints": {"load_order": NaN}', "constraints.load_order"),
        ('"constraints": {"load_order": 1e400}', "constraints.load_order"),
        ('"perf": {"latency_ms_overhead": Infinity}', "perf.latency_ms_overhead"),
        ('"routing": {"priority": -Infinity}', "routing.priority"),
        ('"quality_metrics": {"scores": [1, 2, NaN]}', "quality_metrics.scores[2]"),
        ('"_note": NaN', "_note"),
        ('"constraints": {"max_chain": 18446744073709551616}', "constraints.max_chain"),
        # past Python's 4,300-digit limit: "cannot be read (ValueError)", naming nothing
        ('"constraints": {"max_chain": ' + "9" * 5000 + "}", "constraints.max_chain"),
    ],
)
def test_non_finite_numbers_are_refused_anywhere(tmp_path: Path, raw: str, where: str) -> None:
    text = json.dumps(_data())[:-1] + ", " + raw + "}"
    error = _error(tmp_path, text)
    assert error.startswith(f"manifest.json: {where}: ")
    assert "not a finite number" in error or "an integer beyond 64 bits" in error


def test_a_non_finite_number_from_set_blames_the_option(tmp_path: Path) -> None:
    text = _error(tmp_path, _data(), ["constraints.load_order=NaN"])
    assert text.startswith("--set constraints.load_order=NaN: constraints.load_order: not a")
    # a list item set by its number was blamed on the file (`tags.0` is `tags[0]`)
    text = _error(tmp_path, {**_data(), "tags": ["sql"]}, ["tags.0=1"])
    assert text.startswith("--set tags.0=1: tags[0]: Input should be a valid string"), text


def test_a_manifest_saved_with_a_bom_is_read(tmp_path: Path) -> None:
    """Windows editors start a UTF-8 file with a BOM; it was exit 2 ("Unexpected UTF-8 BOM")
    while data files with one were read."""
    path = tmp_path / "manifest.json"
    path.write_text("\ufeff" + json.dumps(_data()), encoding="utf-8")
    assert load_manifest(path).manifest.name == _data()["name"]


def test_a_manifest_in_utf16_without_a_bom_is_named_as_such(tmp_path: Path) -> None:
    """UTF-16 without its byte-order mark decodes as UTF-8 with a NUL before each ASCII
    character: it was "invalid JSON (Expecting property name ...)"."""
    path = tmp_path / "manifest.json"
    path.write_bytes(json.dumps(_data()).encode("utf-16-le"))
    with pytest.raises(UserError) as info:
        load_manifest(path)
    assert info.value.lines == [f"{path}: not UTF-8 text (NUL bytes: UTF-16?); save it as UTF-8"]


@pytest.mark.parametrize("text", ["", "  \n"])
def test_an_empty_manifest_is_called_empty(tmp_path: Path, text: str) -> None:
    """An empty file was "not UTF-8 text (NUL bytes: UTF-16?)": no NUL in no characters."""
    path = tmp_path / "manifest.json"
    path.write_text(text)
    with pytest.raises(UserError) as info:
        load_manifest(path)
    assert info.value.lines == [f"{path}: is empty; expected a JSON object"]


def test_a_number_of_thousands_of_digits_from_set_is_named_and_cut(tmp_path: Path) -> None:
    """Python's 4,300-digit limit was a ValueError traceback from inside the JSON parser; and
    the option, quoted whole, filled the terminal."""
    text = _error(tmp_path, _data(), ["constraints.max_chain=" + "9" * 5000])
    assert text == (
        "--set constraints.max_chain=99999999999999999999999999999999999999... (5,022 "
        "characters): constraints.max_chain: not a finite number (NaN, Infinity, or too large: "
        "past 1e308, or of thousands of digits); expected a finite number"
    )


def test_many_bad_values_are_listed_at_most_twenty(tmp_path: Path) -> None:
    text = json.dumps(_data())[:-1] + ', "perf": {"x": [' + ", ".join(["NaN"] * 50) + "]}}"
    lines = _error(tmp_path, text).splitlines()
    assert len(lines) == 21 and lines[-1] == "manifest.json: (top level): 30 more values like these"


# --------------------------------------------------------------------------- values are not quoted


@pytest.mark.parametrize(
    ("decoding", "expected"),
    [
        (
            {"temperature": SECRET},
            "temperature: Input should be a valid number (got a string of 10",
        ),
        ({"top_k": SECRET * 3}, "(got a string of 30 characters)"),
        ({"top_k": [SECRET, SECRET]}, "top_k: Input should be a valid integer (got a list of 2"),
        ({"top_k": {SECRET: 1}}, "top_k: Input should be a valid integer (got an object)"),
        ({"use_grammar": SECRET}, "use_grammar: Input should be a valid boolean"),
        ({"stop_sequences": [SECRET, 7]}, "stop_sequences[1]: Input should be a valid string"),
        ({"top_p": 7.5}, "top_p: Input should be less than or equal to 1\n"),
    ],
)
def test_a_wrong_value_is_described_not_quoted(tmp_path: Path, decoding, expected: str) -> None:
    """Errors name the place and the kind of value found, never the value: a manifest string
    may hold a token, a page of text or terminal escapes (STYLE 12)."""
    text = _error(tmp_path, _data(decoding=decoding, metadata={"x": SECRET}))
    assert expected in text + "\n"
    assert "7.5" not in text


def test_a_wrong_choice_lists_the_choices_not_the_value(tmp_path: Path) -> None:
    data = _data()
    data["training"]["config"] = {"lr_scheduler": SECRET, "attention": SECRET, "rank": SECRET}
    lines = sorted(_error(tmp_path, data).splitlines())
    assert lines[0].startswith("manifest.json: training.config.attention: Input should be 'auto'")
    assert lines[1].startswith("manifest.json: training.config.lr_scheduler: Input should be 'li")
    assert lines[2] == (
        "manifest.json: training.config.rank: Input should be a valid integer "
        "(got a string of 10 characters)"
    )


# --------------------------------------------------------------------------- repeated keys


def test_a_key_given_twice_is_refused_where_it_is(tmp_path: Path) -> None:
    """JSON keeps the last of two equal keys without a word: a second `learning_rate` lower
    down would silently win. Each repeat is named by its path, in document order."""
    text = json.dumps(_data())
    text = text.replace('"type": "lora"', '"type": "lora", "r": 8, "r": 16', 1)
    text = text.replace('"path": "train.jsonl"', '"path": "train.jsonl", "path": "b.jsonl"', 1)
    text = text[:-1] + ', "name": "other"}'
    assert _error(tmp_path, text).splitlines() == [
        f"manifest.json: {where}: given more than once; keep one (JSON would silently use the last)"
        for where in ("base_models[0].adapters[0].r", "training.dataset.path", "name")
    ]


def test_repeated_comment_keys_are_notes_not_settings(tmp_path: Path) -> None:
    text = json.dumps(_data())[:-1] + ', "_note": "a", "_note": "b"}'
    assert load_manifest(_write(tmp_path, text)).manifest.name == "expert-e"


def test_many_repeated_keys_are_listed_at_most_twenty(tmp_path: Path) -> None:
    many = ", ".join(f'"k{i}": 1, "k{i}": 2' for i in range(30))
    text = json.dumps(_data())[:-1] + f', "metadata": {{{many}}}}}'
    lines = _error(tmp_path, text).splitlines()
    assert len(lines) == 21 and lines[0].startswith("manifest.json: metadata.k0: given more")
    assert lines[-1] == "manifest.json: 10 more keys like these"


def test_a_misspelt_decoding_key_is_kept_but_noted(tmp_path: Path) -> None:
    """The format allows keys it does not name, so a misspelt `temprature` loads; `check` and
    `train` note it with the nearest known key instead of keeping it unseen."""
    decoding = {"temprature": 0.7, "top-p": 0.9, "beam_width": 4, "_comment": "x", "a b": 1}
    loaded = load_manifest(_write(tmp_path, _data(decoding=decoding)))
    notes = [n for n in resolve(loaded, Environment(cpu_count=2)).notes if "decoding" in n]
    assert notes == [
        "training.decoding.temprature: not a key the format names; kept as it is; did you mean "
        "temperature?",
        "training.decoding.top-p: not a key the format names; kept as it is; did you mean top_p?",
        "training.decoding.beam_width: not a key the format names; kept as it is",
        "training.decoding: not a key the format names; kept as it is",
    ]


# --------------------------------------------------------------------------- dataset references


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("path", "::::", "training.dataset.path: names no dataset before its '::'"),
        ("path", "::train", "training.dataset.path: names no dataset before its '::'"),
        ("path", "   ", "training.dataset: `path` is required"),
        ("path", "a\nb.jsonl", "training.dataset.path: contains a control character"),
        ("path", "~no_such_user_qq/t.jsonl", "training.dataset.path: starts with ~ but that"),
        ("path", ".", "training.dataset.path: " + "{folder} is the folder that holds the manifest"),
        (
            "path",
            "./",
            "training.dataset.path: " + "{folder} is the folder that holds the manifest",
        ),
        (
            "path",
            "..",
            "training.dataset.path: " + "{parent} holds the manifest's folder",
        ),
        ("validation_path", "::x", "training.dataset.validation_path: names no dataset before"),
    ],
)
def test_a_dataset_reference_that_names_no_data_says_so(
    tmp_path: Path, field: str, value: str, expected: str
) -> None:
    """`"path": "::::"` or `"."` read the manifest's own folder as data (the manifest, the
    token cache and the run's outputs among the rows); `~user` of no such user was a
    traceback."""
    data = _data()
    data["training"]["dataset"][field] = value
    with pytest.raises(UserError) as err:
        resolve(load_manifest(_write(tmp_path, data)), Environment(cpu_count=2))
    text = "\n".join(err.value.lines)
    assert expected.format(folder=tmp_path, parent=tmp_path.parent) in text, text


def test_a_task_reference_is_named_by_its_task(tmp_path: Path) -> None:
    data = _data()
    data["training"]["dataset"] = {"type": "multi_task", "tasks": {"sql": {"train": "::a"}}}
    with pytest.raises(UserError, match=r"^training.dataset.tasks.sql.train: names no dataset"):
        resolve(load_manifest(_write(tmp_path, data)), Environment(cpu_count=2))


def test_a_home_folder_that_is_not_known_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"^--output ~no_such_user_qq/x: that home folder"):
        resolved_path("~no_such_user_qq/x", "--output")
    assert not path_is_dir("~no_such_user_qq/x") and path_is_dir(tmp_path)


@pytest.mark.parametrize(
    ("field", "value", "bound"),
    [
        ("alpha", 1e300, "less than or equal to 1000000"),
        ("checkpoint_step", 10**13, "less than or equal to 1000000000000"),
        ("size_bytes", 2**61, "less than or equal to 1152921504606846976"),
    ],
)
def test_an_adapter_entrys_numbers_are_bounded(
    tmp_path: Path, field: str, value: float, bound: str
) -> None:
    """The adapter entry supplies `training.config`'s alpha where the config leaves it out:
    an alpha of 1e300 trained to NaN losses with advice about the learning rate."""
    data = _data()
    data["base_models"][0]["adapters"][0][field] = value
    error = _error(tmp_path, data)
    assert error.startswith(f"manifest.json: base_models[0].adapters[0].{field}: "), error
    assert bound in error
