"""Build a tiny, random-weight Llama model folder that real vLLM can serve, with no model hub.

Why: the tests that start real vLLM engines (on the CPU, with no GPU and no internet) need *some* model in
Hugging Face format. Any hub download is impossible here, so this tool makes one locally in seconds:

* ``transformers.LlamaConfig``: 2 layers, hidden size 256, 4 attention heads, 2 KV heads (head_dim 64:
  vLLM's CPU attention rejects head_dim 16 at the first request), max_position_embeddings 4096.
* Random weights from ``torch.manual_seed(seed)``, saved as ``model.safetensors``. Deterministic: the same seed
  gives byte-identical files, so every engine built from it gives the same tokens at temperature 0.
* A byte-level BPE tokenizer trained with ``tokenizers`` on a text that every Debian system has
  (``/usr/share/common-licenses/GPL-3``; a text embedded here if that file is missing), wrapped in
  ``PreTrainedTokenizerFast`` with ``<s>``/``</s>``/``<pad>`` and a trivial chat template, so both
  ``/v1/completions`` and ``/v1/chat/completions`` work.

The output is gibberish, but real: real tokenization, real forward passes, a real KV cache to transfer.

The folder is built in a temporary directory next to OUT_DIR and renamed into place, so a killed run leaves no
half-written model. Run it with the vLLM venv's python (it needs torch, transformers and tokenizers)::

    $PDFLEET_CACHE/vllm-venv/bin/python scripts/make_tiny_llama.py OUT_DIR [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CORPUS_FILES = ("/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0")

# Used only when no corpus file above exists; any English text will do for a toy tokenizer.
FALLBACK_TEXT = """\
The quick brown fox jumps over the lazy dog. A prefill engine reads the whole prompt and fills the key-value
cache; a decode engine then produces one token after another, reading that cache. Splitting the two lets each
pool be sized for its own work: prefill is bound by compute, decode by memory bandwidth. The router sends a
request to a prefill worker with max_tokens set to one, receives the transfer parameters, and forwards the
request with those parameters to a decode worker, which pulls the cached blocks over the network and continues.
Latency is measured as time to first token and time per output token; throughput as tokens per second.
Hello, world! How are you today? I am fine, thank you. What is the capital of France? Paris is the capital.
One two three four five six seven eight nine ten. Monday Tuesday Wednesday Thursday Friday Saturday Sunday.
"""

VOCAB_SIZE = 2048
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]
# Renders "role: content" lines and, when asked, an "assistant:" prompt for the reply.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def corpus_text() -> str:
    for path in CORPUS_FILES:
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.read()
    return FALLBACK_TEXT * 20


def build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte is encodable: no <unk> in practice
        show_progress=False,
    )
    tok.train_from_iterator(corpus_text().splitlines(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def build_model(out: Path, seed: int, vocab_size: int, bos: int, eos: int, pad: int) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # head_dim = 256 / 4 = 64
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    model.save_pretrained(out, safe_serialization=True)
    # A generation_config.json without sampling defaults, so vLLM's defaults (and the request) decide.
    GenerationConfig(bos_token_id=bos, eos_token_id=eos, pad_token_id=pad).save_pretrained(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path, help="folder to create (replaced if it exists)")
    ap.add_argument("--seed", type=int, default=0, help="torch.manual_seed for the weights (default 0)")
    args = ap.parse_args(argv)

    out = args.out_dir.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    # Leftovers of runs killed more than an hour ago (a SIGKILL skips the cleanup below).
    for stale in list(out.parent.glob(f".{out.name}.tmp-*")) + list(out.parent.glob(f".{out.name}.old-*")):
        if time.time() - stale.stat().st_mtime > 3600:
            shutil.rmtree(stale, ignore_errors=True)
    # SIGTERM (a test's timeout, Ctrl-C in a parent) becomes SystemExit, so the cleanup below still runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        build_tokenizer(tmp)
        from transformers import PreTrainedTokenizerFast

        tok = PreTrainedTokenizerFast.from_pretrained(tmp)
        build_model(tmp, args.seed, len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
        # mkdtemp makes the folder 0700 and safetensors may write 0600: make the model readable by any engine user.
        os.chmod(tmp, 0o755)
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
        # Swap into place: a reader sees either the old folder or the new one, never a half-written one.
        old = None
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.rename(out, old / "m")
        os.rename(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"tiny llama (seed {args.seed}, vocab {len(tok)}) written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
