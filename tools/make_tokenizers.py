#!/usr/bin/env python3
"""Builds the small tokenizers of the C++ tokenizer parity test, and their reference ids.

The Hugging Face `tokenizers` library (version pinned in versions.env) trains four small
BPE tokenizers whose pipelines copy real model families:

  bytelevel_qwen        NFC + Qwen2 regex Split + ByteLevel, merges stored as "a b" strings
  bytelevel_llama3      Llama-3 regex (digits in threes), ignore_merges, BOS template
  sentencepiece_llama2  Prepend + Replace normalizers, byte fallback, fused unk, Strip decoder
  sentencepiece_gemma   Metaspace pre-tokenizer (prepend "first"), byte fallback

The SentencePiece-style trainings are not reproducible run to run (the trainer breaks
count ties in hash-map order), so rerunning changes those two fixtures; each tokenizer.json
is always written together with its own references, so parity is unaffected.

It then encodes every line of tests/tokenize/corpus.txt (and the whole file as one text)
and writes tests/fixtures/tokenizers/<name>/{tokenizer.json,reference.jsonl}. Never edit a
reference by hand: rerun this script.

Usage: tools/make_tokenizers.py [--out tests/fixtures/tokenizers]
"""
import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "tokenize" / "corpus.txt"
HAYSTACK = ROOT / "calib-data" / "haystack"

QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def pinned_version(name):
    for line in (ROOT / "versions.env").read_text().splitlines():
        if line.startswith(name + "="):
            return line.split("=", 1)[1].strip().strip('"')
    sys.exit(f"make_tokenizers: {name} missing from versions.env")


def check_version():
    import tokenizers
    want = pinned_version("TOKENIZERS_VERSION")
    if tokenizers.__version__ != want:
        sys.exit(f"make_tokenizers: tokenizers {tokenizers.__version__} installed, versions.env pins {want}")
    return want


def corpus_lines():
    # Split on "\n" only: lines may hold "\r", U+2028 and other separators on purpose.
    with open(CORPUS, encoding="utf-8", newline="") as f:  # keep "\r" as is
        text = f.read()
    assert text.endswith("\n")
    return text[:-1].split("\n"), text


def training_text():
    lines, _ = corpus_lines()
    texts = list(lines) * 3
    for path in sorted(HAYSTACK.glob("*.txt")):
        texts.extend(p for p in path.read_text(encoding="utf-8").split("\n\n") if p.strip())
    return texts


def special(content, **flags):
    from tokenizers import AddedToken
    return AddedToken(content, special=flags.get("special", True), lstrip=flags.get("lstrip", False),
                      rstrip=flags.get("rstrip", False), normalized=flags.get("normalized", False),
                      single_word=flags.get("single_word", False))


def train_bytelevel(pattern, vocab_size, specials):
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=specials, show_progress=False)
    tok.train_from_iterator(training_text(), trainer)
    return tok


def build_qwen():
    from tokenizers import Tokenizer, decoders, normalizers, processors
    tok = train_bytelevel(QWEN_PATTERN, 4000, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([special("<mask>", lstrip=True)])
    config = json.loads(tok.to_str())
    # Qwen2's own file stores merges as "a b" strings; keep that older format covered.
    config["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in config["model"]["merges"]]
    return Tokenizer.from_str(json.dumps(config))


def build_llama3():
    from tokenizers import Tokenizer, decoders, processors
    tok = train_bytelevel(LLAMA3_PATTERN, 3500, ["<|begin_of_text|>", "<|end_of_text|>"])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[
            ("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])])
    config = json.loads(tok.to_str())
    config["model"]["ignore_merges"] = True
    return Tokenizer.from_str(json.dumps(config))


def train_sentencepiece(vocab_size):
    """BPE with byte fallback: <0x00>..<0xFF> live in the model vocabulary, not as added tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    # A small alphabet forces rare characters (emoji, rare CJK) through byte fallback.
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens,
                                  limit_alphabet=160, show_progress=False)
    tok.train_from_iterator(training_text(), trainer)
    config = json.loads(tok.to_str())
    config["added_tokens"] = [t for t in config["added_tokens"] if t["content"] not in byte_tokens]
    return config


def finish_sentencepiece(config):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_str(json.dumps(config))
    tok.add_special_tokens([special("<start_of_turn>"), special("<end_of_turn>")])
    tok.add_tokens([special("[[note]]", special=False, normalized=True)])
    return tok


def build_llama2():
    from tokenizers import decoders, normalizers, processors
    config = train_sentencepiece(3000)
    config["pre_tokenizer"] = None
    tok = finish_sentencepiece(config)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok


def build_gemma():
    from tokenizers import decoders, pre_tokenizers
    config = train_sentencepiece(2500)
    tok = finish_sentencepiece(config)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="first")])
    return tok


BUILDERS = {"bytelevel_qwen": build_qwen, "bytelevel_llama3": build_llama3,
            "sentencepiece_llama2": build_llama2, "sentencepiece_gemma": build_gemma}


def reference_record(tok, index, text):
    ids = tok.encode(text, add_special_tokens=False).ids
    return {"line": index, "text": text, "ids": ids,
            "ids_with_special": tok.encode(text, add_special_tokens=True).ids,
            "decoded": tok.decode(ids, skip_special_tokens=False)}


def write_fixture(name, tok, out_dir):
    folder = out_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(tok.to_str(pretty=True) + "\n", encoding="utf-8")
    lines, whole = corpus_lines()
    records = [reference_record(tok, i, line) for i, line in enumerate(lines)]
    records.append(reference_record(tok, -1, whole))  # the whole file: newlines, "\r\n" joins
    with open(folder / "reference.jsonl", "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    round_trips = sum(r["decoded"] == r["text"] for r in records)
    print(f"{name}: vocab {tok.get_vocab_size()}, {len(records)} texts, {round_trips} round-trip exactly")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "tokenizers"))
    args = parser.parse_args()
    version = check_version()
    out_dir = pathlib.Path(args.out)
    for name, build in BUILDERS.items():
        write_fixture(name, build(), out_dir)
    (out_dir / "manifest.json").write_text(json.dumps(
        {"tokenizers_version": version, "corpus": "tests/tokenize/corpus.txt", "fixtures": sorted(BUILDERS)},
        indent=2) + "\n")


if __name__ == "__main__":
    main()
