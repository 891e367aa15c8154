#!/usr/bin/env python3
"""Soak: mixed load against one `troupe serve` for a long time, sampling the daemon's resident memory, open
descriptors and threads (from /proc) every `--sample-s` seconds. The mix, per request at random: plain
chat, streamed chat, completions, a streamed answer cancelled after its first event (the client closes),
bad requests (not JSON, an unknown model, a field out of range: each must be a 4xx with OpenAI's error
body), /health and /metrics. Every successful greedy answer must be the reference text.

  python3 tests/chaos/soak.py --troupe build/tools/troupe --model ../shared/models/stories260K.gguf --minutes 60

Flat means: after the warm-up sample (the first after `--warmup-s`), resident memory grows by less than
`--rss-slack` (fraction) and descriptors and threads not at all. Prints each sample and a JSON summary
(--json FILE); exits 1 when a check fails. CTest runs a 3-minute version with the label `soak` when configured
with -DTROUPE_CHAOS_TESTS=ON.
"""

import http.client
import json
import os
import random
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chaos import REFERENCE, Daemon, arguments, log, missing_model  # noqa: E402


def proc_sample(pid):
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    return {"rss": rss, "fds": len(os.listdir(f"/proc/{pid}/fd")), "threads": len(os.listdir(f"/proc/{pid}/task"))}


class Counts:
    def __init__(self):
        self.lock = threading.Lock()
        self.by_kind = {}
        self.failures = []

    def add(self, kind, ok, what=""):
        with self.lock:
            k = self.by_kind.setdefault(kind, [0, 0])
            k[0 if ok else 1] += 1
            if not ok and len(self.failures) < 20:
                self.failures.append(f"{kind}: {what}")


def chat_body(stream=False, **extra):
    b = {"model": "stories", "messages": [{"role": "user", "content": "Once upon a time"}], "temperature": 0,
         "max_tokens": 32, "stream": stream}
    b.update(extra)
    return json.dumps(b)


def request(port, method, path, body=None, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body, {"Content-Type": "application/json"} if body is not None else {})
        r = c.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        c.close()


def streamed_text(body):
    text = ""
    for event in body.split("\n\n"):
        if event.startswith("data: ") and event[6:] != "[DONE]":
            j = json.loads(event[6:])
            for ch in j.get("choices", []):
                text += ch.get("delta", {}).get("content") or ""
    return text


def one(port, counts, rng):
    kind = rng.choice(["chat", "chat", "stream", "stream", "completions", "cancel", "bad", "health", "metrics"])
    try:
        if kind == "chat":
            st, body = request(port, "POST", "/v1/chat/completions", chat_body())
            ok = st == 200 and json.loads(body)["choices"][0]["message"]["content"] == REFERENCE
            counts.add(kind, ok, f"{st} {body[:200]}")
        elif kind == "stream":
            st, body = request(port, "POST", "/v1/chat/completions", chat_body(stream=True))
            ok = st == 200 and body.rstrip().endswith("data: [DONE]") and streamed_text(body) == REFERENCE
            counts.add(kind, ok, f"{st} {body[-200:]}")
        elif kind == "completions":
            st, body = request(port, "POST", "/v1/completions",
                               json.dumps({"model": "stories", "prompt": "Once upon a time", "temperature": 0.8,
                                           "max_tokens": rng.randint(1, 64), "seed": rng.randint(0, 1 << 30)}))
            counts.add(kind, st == 200 and json.loads(body)["choices"][0]["finish_reason"] in ("length", "stop"),
                       f"{st} {body[:200]}")
        elif kind == "cancel":
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            c.request("POST", "/v1/chat/completions", chat_body(stream=True, max_tokens=400),
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            first = r.read1(256) if hasattr(r, "read1") else r.read(1)
            c.sock.close()  # gone mid-answer
            c.close()
            counts.add(kind, r.status == 200 and len(first) > 0, f"{r.status}")
        elif kind == "bad":
            body, want = rng.choice([
                ("{not json", 400),
                (json.dumps({"model": "nope", "messages": [{"role": "user", "content": "x"}]}), 404),
                (json.dumps({"model": "stories", "messages": [{"role": "user", "content": "x"}], "temperature": -1}), 400),
                (json.dumps({"model": "stories"}), 400),
            ])
            st, resp = request(port, "POST", "/v1/chat/completions", body)
            ok = st == want and "message" in json.loads(resp).get("error", {})
            counts.add(kind, ok, f"{st} (want {want}) {resp[:200]}")
        elif kind == "health":
            st, body = request(port, "GET", "/health")
            counts.add(kind, st == 200, f"{st}")
        else:
            st, body = request(port, "GET", "/metrics")
            counts.add(kind, st == 200 and "troupe_requests_total" in body, f"{st}")
    except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
        counts.add(kind, False, repr(e))


def main():
    def own(ap):
        ap.add_argument("--minutes", type=float, default=60)
        ap.add_argument("--clients", type=int, default=8)
        ap.add_argument("--sample-s", type=float, default=60)
        ap.add_argument("--warmup-s", type=float, default=120)
        ap.add_argument("--rss-slack", type=float, default=0.10)

    a = arguments(__doc__, own)
    if (rc := missing_model(a, "soak")) is not None:
        return rc

    work = tempfile.mkdtemp(prefix="troupe-soak-")
    cfg = f"""[server]
port = 0
shutdown_grace_s = 5
[runtime]
threads = 2
[[model]]
name = "stories"
path = "{os.path.abspath(a.model)}"
chat_template = "raw"
threads = 2
n_ctx = 4096
n_seq_max = 4
"""
    d = Daemon(a.troupe, cfg, work)
    log(f"daemon on {d.port}, pid {d.proc.pid}; log {d.log_path}")
    counts = Counts()
    stop = threading.Event()

    def client(seed):
        rng = random.Random(seed)
        while not stop.is_set() and d.alive():
            one(d.port, counts, rng)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    t0 = time.time()
    for t in threads:
        t.start()
    samples = []
    try:
        next_at = t0
        while time.time() - t0 < a.minutes * 60 and d.alive():
            if time.time() >= next_at:
                s = proc_sample(d.proc.pid)
                s["t"] = round(time.time() - t0)
                with counts.lock:
                    s["requests"] = sum(ok + bad for ok, bad in counts.by_kind.values())
                samples.append(s)
                log(f"t={s['t']:5d}s rss {s['rss'] / 2**20:7.1f} MiB, {s['fds']} descriptors, {s['threads']} threads, "
                    f"{s['requests']} requests")
                next_at += a.sample_s
            time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join(180)
    died = not d.alive()
    end = proc_sample(d.proc.pid) if not died else None
    d.stop()

    base = next((s for s in samples if s["t"] >= a.warmup_s), samples[0] if samples else None)
    last = samples[-1] if samples else None
    failures = []
    if died:
        failures.append("the daemon died")
    if base and last:
        if last["rss"] > base["rss"] * (1 + a.rss_slack):
            failures.append(f"resident memory grew {base['rss']} -> {last['rss']} bytes after the warm-up")
        if last["fds"] > base["fds"] or last["threads"] > base["threads"]:
            failures.append(f"descriptors {base['fds']} -> {last['fds']}, threads {base['threads']} -> {last['threads']}")
    if counts.failures:
        failures.append(f"{sum(b for _, b in counts.by_kind.values())} request(s) failed: {counts.failures[:5]}")
    summary = {"minutes": a.minutes, "clients": a.clients, "requests": counts.by_kind, "samples": samples,
               "after_load": end, "baseline_sample": base, "failures": failures}
    print(json.dumps({k: v for k, v in summary.items() if k != "samples"}, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=2)
    for f in failures:
        print("soak: FAIL: " + f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
