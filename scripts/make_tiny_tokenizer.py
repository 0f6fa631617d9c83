"""Train the tiny byte-level BPE tokenizer used by the tests and the demo expert.

Built like Qwen2/Qwen3's tokenizer (NFC normalizer, Qwen's split regex, byte-level BPE, no
special tokens added on encode), only with about 4k tokens instead of 151k: trained on the demo
expert's SQL data plus a little generic English and Python text generated here. `<|endoftext|>`
(eos and pad), `<|im_start|>` and `<|im_end|>` are special tokens with the last ids, as in Qwen;
the chat template is Qwen2.5's plain ChatML one without a default system message.

Writes the same files to tests/assets/tiny-tokenizer/ and experts/demo/model/.
Deterministic: `python scripts/make_tiny_tokenizer.py` (after scripts/make_demo_data.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qwen_tokenizer import CHATML_TEMPLATE  # noqa: E402  (scripts/qwen_tokenizer.py)

REPO = Path(__file__).resolve().parent.parent
DEMO_DATA = REPO / "experts" / "demo" / "data" / "train.jsonl"
OUT_DIRS = [REPO / "tests" / "assets" / "tiny-tokenizer", REPO / "experts" / "demo" / "model"]
SEED = 1234
BPE_VOCAB_SIZE = 4000  # learned tokens; the 3 special tokens come after them
MODEL_MAX_LENGTH = 2048

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]

# Qwen2/Qwen3's pre-tokenizer split pattern (transformers' Qwen2Tokenizer PRETOKENIZE_REGEX).
QWEN_SPLIT_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


ENGLISH = """\
The quick brown fox jumps over the lazy dog. A language model predicts the next token from the
ones before it, and a tokenizer decides what a token is. Training a small adapter on top of a
large base model is cheaper than training the whole model, and it is often good enough.
When the data loader cannot keep up, the GPU waits: utilization drops, and the run takes longer
than it should. Packing several short examples into one row wastes less compute on padding.
Please write a short summary of the report, then list the three most important findings.
What is the capital of France? Paris is the capital and the largest city of France.
She said: "It's done, isn't it?" and he answered that they'd be there by nine o'clock.
Numbers like 3.14159, 2024-06-01, 100%, $19.99 and 1,000,000 appear in ordinary text too.
"""

CODE = '''\
import json
from pathlib import Path


def load_rows(path: Path) -> list[dict]:
    """Read one JSON object per line."""
    rows = []
    with path.open("r", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    return rows


class Counter:
    def __init__(self, start: int = 0) -> None:
        self.value = start

    def increment(self, step: int = 1) -> int:
        self.value += step
        return self.value


if __name__ == "__main__":
    for i, row in enumerate(load_rows(Path("data.jsonl"))):
        print(f"{i}: {row['text'][:80]!r}")
'''

_WORDS = (
    "time year people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot "
    "right study book eye job word business issue side kind head house service friend father "
    "power hour game line end member law car city community name president team minute idea "
    "kid body information back parent face others level office door health person art war "
    "history party result change morning reason research girl guy moment air teacher force "
    "education foot boy age policy music market sense nation plan college interest death "
    "experience effect class control care field development role effort rate heart drug show "
    "leader light voice wife police mind price report decision son view relationship town "
    "road arm difference value building action model season society tax director position "
    "player record paper space ground form event official matter center couple site project "
    "activity star table need court oil situation cost industry figure street image phone "
    "data file path value list dict string integer float boolean error exception module "
    "function method argument parameter variable default return yield import class object "
    "instance attribute property index key item element array vector matrix tensor batch "
    "loss gradient optimizer scheduler learning token sequence length padding mask label "
    "be have do say get make go know take see come think look want give use find tell ask "
    "seem feel try leave call keep let begin help talk turn start show hear play run move "
    "like live believe hold bring happen write provide sit stand lose pay meet include "
    "continue set learn lead understand watch follow stop create speak read allow add spend "
    "grow open walk win offer remember love consider appear buy wait serve die send expect "
    "build stay fall cut reach kill remain suggest raise pass sell require decide pull "
    "good new first last long great little own other old big high different small large "
    "next early young important few public bad same able free sure clear simple whole "
    "recent certain real best better true strong possible special easy hard major late "
    "about after again against all also always because before between both during each "
    "every from here however into just more most never often only over since still such "
    "than then there these through under until very well when where which while with"
)
WORDS = _WORDS.split()
_SYLLABLES = (
    "ka lo mi ne ru sa to vi ba de fo gu ha ji ke la mo nu pe qui ra si tu ve wa xi yo ze "
    "an ber cor dan el fin gor hal ish jun kel lor man nor ost per quen ril son tar ul ven"
)
SYLLABLES = _SYLLABLES.split()


def _sentence(rng: random.Random) -> str:
    words = rng.choices(WORDS, k=rng.randint(5, 16))
    return " ".join(words).capitalize() + rng.choice([".", ".", ",", "?", "!", ":", ";"])


def _code_line(rng: random.Random) -> str:
    name = "_".join(rng.choices(WORDS, k=rng.randint(1, 3)))
    other = "".join(w.capitalize() for w in rng.choices(WORDS, k=rng.randint(1, 3)))
    number = rng.randint(0, 99999)
    return rng.choice(
        [
            f"    {name} = {other}({number})",
            f"def {name}(self, {rng.choice(WORDS)}: int = {number}) -> {other}:",
            f"        return self.{name}[{number % 100}] + {rng.random():.4f}",
            f"class {other}({rng.choice(WORDS).capitalize()}Base):",
            f"    if {name} is None or len({name}) > {number}:",
            f'        raise ValueError(f"bad {{{name}!r}}: expected {rng.choice(WORDS)}")',
        ]
    )


def _pseudo_word(rng: random.Random) -> str:
    return "".join(rng.choices(SYLLABLES, k=rng.randint(2, 4)))


def generic_text(rng: random.Random, n_lines: int = 6000) -> Iterator[str]:
    """Fixed English and Python samples, then seeded random prose, code and names."""
    yield ENGLISH
    yield CODE
    for _ in range(n_lines):
        kind = rng.random()
        if kind < 0.5:
            yield _sentence(rng)
        elif kind < 0.85:
            yield _code_line(rng)
        else:
            yield (
                f"{_pseudo_word(rng).capitalize()} {_pseudo_word(rng).capitalize()} met "
                f"{_pseudo_word(rng)} in {_pseudo_word(rng).capitalize()}."
            )


def demo_texts(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]


def train_tokenizer(texts: list[str]):
    """A Qwen-style byte-level BPE tokenizer trained on `texts`."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    tok = Tokenizer(BPE(fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


def build(demo_data: Path = DEMO_DATA):
    """The tiny tokenizer as a transformers fast tokenizer."""
    from transformers import PreTrainedTokenizerFast

    # The demo corpus is plain ChatML text; its markers are learned as special tokens, not BPE.
    texts = [t for text in demo_texts(demo_data) for t in _strip_specials(text)]
    texts += list(generic_text(random.Random(SEED)))
    return PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(texts),
        eos_token=ENDOFTEXT,
        pad_token=ENDOFTEXT,
        extra_special_tokens=[IM_START, IM_END],
        chat_template=CHATML_TEMPLATE,
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
    )


def _strip_specials(text: str) -> list[str]:
    """Split text on the special tokens so they do not shape the learned merges."""
    pieces = [text]
    for special in SPECIAL_TOKENS:
        pieces = [p for piece in pieces for p in piece.split(special)]
    return [p for p in pieces if p]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, action="append", help="default: both asset folders")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tokenizer = build()
    for out in args.out or OUT_DIRS:
        out.mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(out)
        print(f"saved tokenizer ({len(tokenizer)} tokens) to {out}")


if __name__ == "__main__":
    main()
