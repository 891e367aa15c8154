#!/usr/bin/env python3
"""A Llama-3.2-1B-shaped Q4_K_M with every layer on a `troupe peer --device cpu -t 1` (issue 54's case): long
prompts answer, no health check fails while a micro-batch takes seconds on the peer, and the greedy text is
the same as the same file's on this CPU.

The model is made once into --work (random weights with the 1B shapes by ../shared/tools/make-synthetic-model,
SmolLM2's tokenizer, then `troupe quantize ... Q4_K_M`; about 700 MiB, kept for the next run). Then one
daemon serves it from the peer and one from its own CPU, and each prompt (the words of tests/data/story.txt,
repeated: 520 words are 638 tokens, 1650 words 2,011) is completed with 4 greedy tokens by both.

  python3 tests/big/peer_1b.py --troupe build/tools/troupe --synth ../shared/tools/make-synthetic-model \\
      --tokenizer-model models/SmolLM2-135M-Instruct.Q4_1.gguf --work build/big-models

Exits 0 when every check holds, 1 when one fails, 77 when a tool or model is missing (1 under CI=true).
CTest runs it with the label `big-model` when configured with -DTROUPE_BIG_MODEL_TESTS=ON (it takes minutes).
"""

import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "chaos"))
from chaos import Daemon, Peer, free_port, log  # noqa: E402

STORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "story.txt")
# (words of the story, the prompt tokens they make with SmolLM2's tokenizer)
PROMPTS = [(520, 638), (1650, 2011)]


def missing(what):
    print(f"peer_1b: {what}", file=sys.stderr)
    return 77 if os.environ.get("CI") != "true" else 1


def make_model(a):
    """The Q4_K_M file, made once into a.work."""
    os.makedirs(a.work, exist_ok=True)
    q4km = os.path.join(a.work, "llama3.2-1b-synthetic.Q4_K_M.gguf")
    if os.path.exists(q4km):
        return q4km
    f16 = os.path.join(a.work, "llama3.2-1b-synthetic.F16.gguf")
    log("making the 1B-shaped model (random weights)")
    subprocess.run([a.synth, "llama3.2-1b", a.tokenizer_model, f16], check=True)
    tmp = q4km + ".part"
    subprocess.run([a.troupe, "quantize", f16, tmp, "Q4_K_M", "2"], check=True)
    os.replace(tmp, q4km)
    os.remove(f16)
    return q4km


def prompt(n_words):
    words = open(STORY).read().split()
    return " ".join((words * (n_words // len(words) + 1))[:n_words])


def complete(d, text):
    body = json.dumps({"model": "m", "prompt": text, "max_tokens": 4, "temperature": 0})
    c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=900)
    try:
        t0 = time.time()
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        out = json.loads(r.read().decode())
        return r.status, out, time.time() - t0
    finally:
        c.close()


def config(model, device, peer_port=None):
    peer = f'[[peer]]\nname = "c"\naddress = "127.0.0.1:{peer_port}"\n\n' if peer_port else ""
    return (f'[server]\nhost = "127.0.0.1"\nport = 0\n\n{peer}[[model]]\nname = "m"\npath = "{model}"\n'
            f'n_ctx = 2048\nn_seq_max = 1\nthreads = 2\ndevices = [{{ device = "{device}", layers = 99 }}]\n')


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--troupe", required=True)
    ap.add_argument("--synth", required=True, help="../shared/tools/make-synthetic-model")
    ap.add_argument("--tokenizer-model", required=True, help="a GGUF whose tokenizer the model takes (SmolLM2)")
    ap.add_argument("--work", required=True, help="where the made model is kept")
    a = ap.parse_args()
    a.troupe, a.synth, a.tokenizer_model, a.work = map(os.path.abspath, (a.troupe, a.synth, a.tokenizer_model, a.work))
    for path in (a.troupe, a.synth, a.tokenizer_model):
        if not os.path.exists(path):
            return missing(f"{path} is missing")
    model = make_model(a)

    failures = []

    def check(ok, what):
        log(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    peer_port = free_port()
    peer = Peer(a.troupe, peer_port)  # -t 1, --device cpu
    with tempfile.TemporaryDirectory() as remote_dir, tempfile.TemporaryDirectory() as local_dir:
        remote = local = None
        try:
            remote = Daemon(a.troupe, config(model, f"RPC[127.0.0.1:{peer_port}]#0", peer_port), remote_dir)
            local = Daemon(a.troupe, config(model, "CPU"), local_dir)
            for n_words, n_tokens in PROMPTS:
                text = prompt(n_words)
                answers = {}
                for name, d in (("peer", remote), ("local", local)):
                    status, out, seconds = complete(d, text)
                    ok = status == 200 and "choices" in out
                    check(ok, f"{n_words} words on the {name}: HTTP {status} in {seconds:.1f} s"
                              + ("" if ok else f": {json.dumps(out)[:300]}"))
                    if ok:
                        answers[name] = out["choices"][0]["text"]
                        check(out["usage"]["prompt_tokens"] == n_tokens,
                              f"{n_words} words: {out['usage']['prompt_tokens']} prompt tokens, {n_tokens} expected")
                if len(answers) == 2:
                    check(answers["peer"] == answers["local"],
                          f"{n_tokens}-token prompt: the peer's text {answers['peer']!r} is the local {answers['local']!r}")
            log_text = open(remote.log_path).read()
            check("is down" not in log_text and "health check failed" not in log_text,
                  "the daemon never took the peer for down")
            check(peer.proc.poll() is None, "the peer still runs")
        finally:
            for d in (remote, local):
                if d is not None:
                    d.stop()
            peer.stop()
    if failures:
        print(f"peer_1b: {len(failures)} check(s) failed", file=sys.stderr)
        return 1
    print("peer_1b: every check holds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
