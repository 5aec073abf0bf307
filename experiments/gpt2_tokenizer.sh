#!/usr/bin/env bash
# GPT-2's tokenizer (its 50,256 BPE ranks in tiktoken's format) from PyPI, where no other network is: the
# openai-whisper source distribution ships it as whisper/assets/gpt2.tiktoken. Checked by its SHA-256.
# Usage: experiments/gpt2_tokenizer.sh DIR     -> DIR/gpt2.tiktoken; then --tokenizer tiktoken:gpt2:DIR/gpt2.tiktoken
set -euo pipefail
dir=$1
sha=306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930
mkdir -p "$dir"
if [[ ! -f "$dir/gpt2.tiktoken" ]]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    python -m pip download openai-whisper==20250625 --no-deps --no-binary :all: -d "$tmp" -q
    tar -xzf "$tmp"/openai_whisper-20250625.tar.gz -C "$tmp" openai_whisper-20250625/whisper/assets/gpt2.tiktoken
    cp "$tmp"/openai_whisper-20250625/whisper/assets/gpt2.tiktoken "$dir/"
fi
echo "$sha  $dir/gpt2.tiktoken" | sha256sum -c -
