"""Source-language encoding with a Hugging Face tokenizer (MiniPost from a public model) against
SentencePiece, on the bundled English corpus, in MB of text per second.

A byte-level BPE tokenizer of ``--vocab`` pieces (RoBERTa's kind; trained here with ``tokenizers``
because the hub is out of reach) and a SentencePiece unigram model of the same size are both trained
on ``data/demo/corpus/en.txt.xz``; each then encodes every line of it through the interface
``minimodel prepare`` uses (``encode(lines)``), best of ``--repeats``.

    .venv/bin/python benchmarks/bench_hf_encode.py [--vocab 8000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from minimodel.data.corpus import iter_documents  # noqa: E402
from minimodel.data.spm_training import train_tokenizer  # noqa: E402
from minimodel.data.tokenizer import HFTokenizer  # noqa: E402

CORPUS = Path(__file__).resolve().parent.parent / "data" / "demo" / "corpus" / "en.txt.xz"


def best_rate(encode, lines: list[str], mb: float, repeats: int) -> tuple[float, int]:
    times, n = [], 0
    for _ in range(repeats):
        t = time.perf_counter()
        n = sum(map(len, encode(lines)))
        times.append(time.perf_counter() - t)
    return mb / min(times), n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaTokenizerFast

    lines = [line for doc in iter_documents(CORPUS) for line in doc]
    mb = sum(len(line.encode("utf-8")) for line in lines) / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        bpe = ByteLevelBPETokenizer()
        bpe.train_from_iterator(lines, vocab_size=args.vocab - 1, min_frequency=2,
                                special_tokens=["<s>", "<pad>", "</s>", "<unk>"], show_progress=False)
        RobertaTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>", sep_token="</s>",
                             cls_token="<s>", unk_token="<unk>", pad_token="<pad>",
                             mask_token="<mask>").save_pretrained(Path(tmp) / "bpe")
        hf = HFTokenizer(str(Path(tmp) / "bpe"))
        spm = train_tokenizer(CORPUS, Path(tmp) / "spm.model", args.vocab, threads=2)
        print(f"corpus {CORPUS.name}: {mb:.2f} MB of text, {len(lines):,} lines")
        for name, tok, kw in (("HF byte-level BPE (HFTokenizer.encode)", hf, {}),
                              ("SentencePiece unigram (Tokenizer.encode, 2 threads)", spm, {"threads": 2})):
            rate, n = best_rate(lambda x: tok.encode(x, **kw), lines, mb, args.repeats)
            print(f"{name}, {tok.vocab_size:,} pieces: {rate:.1f} MB/s, {n:,} tokens")


if __name__ == "__main__":
    main()
