#!/usr/bin/env python3
"""Chaos under load: a daemon serving stories260K split over its own CPU and two `troupe peer` processes (the
second reached through a loopback TCP proxy), 16 clients streaming greedy answers, while the script

  1. kills peer A with SIGKILL, then starts it again on the same port,
  2. freezes peer B with SIGSTOP for 10 s, then SIGCONT,
  3. cuts every connection through the proxy (the daemon's link to peer B), which accepts again at once,

and finally lets everything recover. Every answer must either be complete with the reference text or end
with a clear error (an HTTP error with OpenAI's error body, or an error event in the stream); none may hang
(no byte for `--hang-s`) and the daemon must not die. After recovery the memory breakdown must return to
its baseline and the daemon's descriptors and threads (from /proc) to their counts before the chaos.

  python3 tests/chaos/chaos.py --troupe build/tools/troupe --model ../shared/models/stories260K.gguf

Prints a table and a JSON summary (--json FILE); exits 1 when a check fails. CTest runs it with the label
`chaos` when configured with -DTROUPE_CHAOS_TESTS=ON (off by default: it runs for minutes).
"""

import argparse
import http.client
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

REFERENCE = ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw"


def arguments(doc, add):
    """The command line both scripts share (--troupe, --model, --json) with the script's own (add(parser))."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--troupe", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--json", help="write the summary here")
    add(ap)
    return ap.parse_args()


def missing_model(a, name):
    """The exit code when the model is absent (77: skipped; under CI=true a failure), else None."""
    if os.path.exists(a.model):
        return None
    print(f"{name}: {a.model} is missing", file=sys.stderr)
    return 77 if os.environ.get("CI") != "true" else 1


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Proxy:
    """A loopback TCP proxy: listen_port -> target_port; cut() resets every connection through it."""

    def __init__(self, listen_port, target_port):
        self.target_port = target_port
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", listen_port))
        self.lsock.listen(64)
        self.port = self.lsock.getsockname()[1]
        self.lock = threading.Lock()
        self.pairs = []
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopped:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
                u.settimeout(None)
            except OSError:
                c.close()
                continue
            for s in (c, u):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.lock:
                self.pairs.append((c, u))
            threading.Thread(target=self._pump, args=(c, u), daemon=True).start()

    def _pump(self, a, b):
        socks = [a, b]
        try:
            while True:
                r, _, _ = select.select(socks, [], [], 1.0)
                for s in r:
                    data = s.recv(1 << 16)
                    if not data:
                        raise OSError("closed")
                    (b if s is a else a).sendall(data)
        except (OSError, ValueError):
            pass
        finally:
            for s in socks:
                try:
                    s.close()
                except OSError:
                    pass
            with self.lock:
                if (a, b) in self.pairs:
                    self.pairs.remove((a, b))

    def cut(self):
        with self.lock:
            pairs = list(self.pairs)
        for a, b in pairs:
            for s in (a, b):
                try:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        return len(pairs)

    def close(self):
        self.stopped = True
        self.lsock.close()
        self.cut()


class Peer:
    def __init__(self, troupe, port):
        self.troupe, self.port = troupe, port
        self.start()

    def start(self):
        self.proc = subprocess.Popen([self.troupe, "peer", "--port", str(self.port), "-t", "1", "--device", "cpu"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            raise RuntimeError(f"peer on port {self.port} did not start: {line!r}")
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()

    def signal(self, sig):
        self.proc.send_signal(sig)

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Daemon:
    def __init__(self, troupe, config_text, workdir):
        path = os.path.join(workdir, "daemon.toml")
        with open(path, "w") as f:
            f.write(config_text)
        self.log_path = os.path.join(workdir, "daemon.log")
        self.logf = open(self.log_path, "w")
        self.proc = subprocess.Popen([troupe, "serve", "--config", path], stdout=self.logf, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        self.port = None
        while time.time() < deadline:
            text = open(self.log_path).read()
            m = re.search(r"listening on http://127\.0\.0\.1:([0-9]+)", text)
            if m and "ready" in text:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        if self.port is None:
            raise RuntimeError("the daemon did not start:\n" + open(self.log_path).read()[-4000:])

    def alive(self):
        return self.proc.poll() is None

    def get(self, path, timeout=10):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read().decode()
        finally:
            c.close()

    def counts(self):
        pid = self.proc.pid
        return len(os.listdir(f"/proc/{pid}/fd")), len(os.listdir(f"/proc/{pid}/task"))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.logf.close()


def memory_self(d):
    """Bytes per (buffer type, kind) of /v1/memory: what the daemon accounts for itself."""
    status, body = d.get("/v1/memory")
    if status != 200:
        return None
    out = {}

    def walk(x, path):
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, path + (k,))
        elif isinstance(x, list):
            for i, v in enumerate(x):
                key = v.get("name") or v.get("buft") or v.get("device") if isinstance(v, dict) else None
                walk(v, path + (str(key if key is not None else i),))
        elif isinstance(x, (int, float)) and path and path[-1] in ("model", "context", "compute"):
            out["/".join(path)] = x

    walk(json.loads(body), ())
    return out


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.completed = 0
        self.errors = {}  # message (first 100 characters) -> count
        self.wrong = []  # answers that ended as complete but with other text
        self.hung = 0
        self.broken = []  # ended without [DONE] and without an error
        self.ok_times = []  # time.time() of each completed answer

    def error(self, what):
        with self.lock:
            key = what[:100]
            self.errors[key] = self.errors.get(key, 0) + 1


def one_request(port, stats, hang_s):
    body = json.dumps({"model": "stories", "messages": [{"role": "user", "content": "Once upon a time"}],
                       "temperature": 0, "max_tokens": 32, "stream": True})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=hang_s)
    try:
        c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            data = r.read().decode(errors="replace")
            try:
                msg = json.loads(data)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                with stats.lock:
                    stats.broken.append(f"status {r.status} without an error body: {data[:200]!r}")
                return
            stats.error(f"{r.status}: {msg}")
            return
        text, done, error = "", False, None
        buf = b""
        while True:
            chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if not event.startswith(b"data: "):
                    continue
                payload = event[6:].decode()
                if payload == "[DONE]":
                    done = True
                    continue
                j = json.loads(payload)
                if "error" in j:
                    error = j["error"]["message"]
                    continue
                for ch in j.get("choices", []):
                    text += ch.get("delta", {}).get("content") or ""
        if error is not None:
            stats.error(f"stream: {error}")
        elif done and text == REFERENCE:
            with stats.lock:
                stats.completed += 1
                stats.ok_times.append(time.time())
        elif done:
            with stats.lock:
                stats.wrong.append(text)
        else:
            with stats.lock:
                stats.broken.append(f"stream ended without [DONE] or an error after {len(text)} characters")
    except socket.timeout:
        with stats.lock:
            stats.hung += 1
    except ConnectionRefusedError:
        stats.error("connection refused")
    except (ConnectionError, http.client.HTTPException) as e:
        with stats.lock:
            stats.broken.append(f"connection: {e!r}")
    finally:
        c.close()


def main():
    def own(ap):
        ap.add_argument("--clients", type=int, default=16)
        ap.add_argument("--hang-s", type=float, default=60, help="no byte for this long: the request hung")
        ap.add_argument("--settle-s", type=float, default=15, help="load before and after the chaos")

    a = arguments(__doc__, own)
    if (rc := missing_model(a, "chaos")) is not None:
        return rc

    work = tempfile.mkdtemp(prefix="troupe-chaos-")
    port_a, port_b, port_proxy = free_port(), free_port(), free_port()
    peer_a = Peer(a.troupe, port_a)
    peer_b = Peer(a.troupe, port_b)
    proxy = Proxy(port_proxy, port_b)
    cfg = f"""[server]
port = 0
shutdown_grace_s = 5
[runtime]
threads = 1
[[peer]]
name = "a"
address = "127.0.0.1:{port_a}"
[[peer]]
name = "b"
address = "127.0.0.1:{port_proxy}"
[[model]]
name = "stories"
path = "{os.path.abspath(a.model)}"
chat_template = "raw"
threads = 1
n_ctx = 2048
n_seq_max = 4
devices = [{{ device = "CPU", layers = 1 }}, {{ device = "RPC[127.0.0.1:{port_a}]#0", layers = 2 }}, {{ device = "RPC[127.0.0.1:{port_proxy}]#0", layers = 2 }}]
"""
    d = Daemon(a.troupe, cfg, work)
    log(f"daemon on {d.port}; peer a on {port_a}, peer b on {port_b} through the proxy on {port_proxy}; log {d.log_path}")
    failures = []
    summary = {}
    try:
        # Warm up and take the baselines.
        warm = Stats()
        for _ in range(3):
            one_request(d.port, warm, a.hang_s)
        if warm.completed != 3:
            raise RuntimeError(f"warm-up answers were not the reference: {vars(warm)}")
        time.sleep(1)
        base_mem = memory_self(d)
        base_fd, base_threads = d.counts()
        log(f"baseline: {base_fd} descriptors, {base_threads} threads, {len(base_mem or {})} memory figures")

        stats = Stats()
        stop = threading.Event()

        def client():
            while not stop.is_set():
                one_request(d.port, stats, a.hang_s)
                if not d.alive():
                    return

        threads = [threading.Thread(target=client) for _ in range(a.clients)]
        for t in threads:
            t.start()
        t0 = time.time()
        events = []

        def mark(name):
            events.append((name, time.time()))
            log(name)

        time.sleep(a.settle_s)
        mark("SIGKILL peer a")
        peer_a.kill()
        time.sleep(10)
        peer_a.start()
        mark("peer a started again")
        time.sleep(a.settle_s)
        mark("SIGSTOP peer b")
        peer_b.signal(signal.SIGSTOP)
        time.sleep(10)
        peer_b.signal(signal.SIGCONT)
        mark("SIGCONT peer b")
        time.sleep(a.settle_s)
        n = proxy.cut()
        mark(f"proxy cut {n} connection(s) to peer b")
        time.sleep(a.settle_s)
        mark("load ends")
        stop.set()
        for t in threads:
            t.join(a.hang_s + 30)
        elapsed = time.time() - t0

        # Recovery of each event: from the event to the first answer completed after it.
        recovery = {}
        for name, when in events[:-1]:
            after = [t for t in stats.ok_times if t > when]
            recovery[name] = round(min(after) - when, 2) if after else None

        # Back to baseline: the model ready, memory and descriptors as before.
        ready_at = time.time()
        while time.time() - ready_at < 60:
            try:
                status, body = d.get("/health")
                if status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        after_check = Stats()
        one_request(d.port, after_check, a.hang_s)
        time.sleep(2)
        mem = memory_self(d)
        fd, nthreads = d.counts()
        settle = time.time()
        while (fd > base_fd or nthreads > base_threads) and time.time() - settle < 30:
            time.sleep(1)
            fd, nthreads = d.counts()
        mem_diff = {k: (base_mem.get(k), v) for k, v in (mem or {}).items() if base_mem.get(k) != v}
        mem_diff.update({k: (v, None) for k, v in base_mem.items() if mem is None or k not in mem})

        summary = {
            "seconds": round(elapsed, 1),
            "clients": a.clients,
            "completed": stats.completed,
            "failed_with_error": sum(stats.errors.values()),
            "errors": stats.errors,
            "wrong_text": len(stats.wrong),
            "ended_without_error": len(stats.broken),
            "broken_examples": stats.broken[:5],
            "hung": stats.hung,
            "daemon_died": not d.alive(),
            "recovery_s": recovery,
            "answer_after_recovery": after_check.completed == 1,
            "descriptors": [base_fd, fd],
            "threads": [base_threads, nthreads],
            "memory_changed": {k: list(v) for k, v in mem_diff.items()},
        }
        if stats.hung:
            failures.append(f"{stats.hung} request(s) hung")
        if stats.wrong:
            failures.append(f"{len(stats.wrong)} answer(s) complete with other text, e.g. {stats.wrong[0]!r}")
        if stats.broken:
            failures.append(f"{len(stats.broken)} answer(s) ended without an error: {stats.broken[:3]}")
        if not d.alive():
            failures.append("the daemon died")
        if after_check.completed != 1:
            failures.append(f"no reference answer after recovery: {vars(after_check)}")
        if mem_diff:
            failures.append(f"memory breakdown differs from its baseline: {mem_diff}")
        if fd > base_fd or nthreads > base_threads:
            failures.append(f"descriptors {base_fd} -> {fd}, threads {base_threads} -> {nthreads}")
        if stats.completed == 0:
            failures.append("no answer completed under chaos")
    finally:
        d.stop()
        proxy.close()
        peer_a.stop()
        peer_b.stop()

    print(json.dumps(summary, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=2)
    for f in failures:
        print("chaos: FAIL: " + f, file=sys.stderr)
    if failures:
        print("chaos: daemon log: " + d.log_path, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
