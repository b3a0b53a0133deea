"""Out-of-memory soak of the whole agent (scripts/oom_soak.sh runs it; not part of the test command).

Each iteration runs parley-host --jsonl with tests/tools/failmalloc.so preloaded, failing about one
allocation in K (K, the seed and the first allocation that may fail drawn at random), on one store
(memory, an SQLite file, a redis-server started here), against the fake LLM, with conversations that
call tools, fold turns into summaries (max_history_turns 2), append messages, query, list and clear.
Then failures are switched off (SIGUSR2) and the same process reads every conversation back; for
SQLite and Redis a second parley-host without failures reads them again and takes one more turn in
each.  Checked (docs/errors.md, docs/history.md):
  - the shim ends with 0, or 1/2 for a create() or plugin load that ran out of memory; never a
    signal, never past the timeout (a hang);
  - every input line is answered once; a turn's error is a documented code (never `internal`), and
    codes other than no_memory are counted and shown with a message for review;
  - every stored turn is whole: a user message (or one appended message), tool calls each answered
    by its result, an answer; a turn that succeeded is stored, one that failed is not;
  - under --valgrind, no definitely or indirectly lost block and no memory error.
A failing iteration leaves its input, options and output in the artefact folder and is printed.
"""
import argparse
import collections
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import harness  # noqa: E402
from harness import FakeLLM, options, tool_sequence_problems  # noqa: E402
from redis_server import RedisServer  # noqa: E402

CODES = {"invalid_input", "invalid_options", "busy", "cancelled", "timeout", "connect",
         "rate_limited", "http_status", "bad_response", "tool_loop", "not_found", "no_memory",
         "internal", "storage", "context_overflow"}
BAD_CODES = {"internal"}
RATES = [20, 50, 200, 1000, 5000]
VG = ["valgrind", "--soname-synonyms=somalloc=nouserintercepts", "--error-exitcode=99",
      "--keep-debuginfo=yes",  # parley.so is dlclose()d before the leak report
      "--leak-check=full", "--errors-for-leak-kinds=definite,indirect",
      "--show-leak-kinds=definite,indirect", "--num-callers=30"]


def script(it, rng):
    """The input lines of one iteration and the ids of its conversations."""
    c = ["it%d-%s" % (it, x) for x in "abcd"]
    turns = [
        {"text": "hello", "conversation_id": c[0]},
        {"text": "turn on the kitchen light", "conversation_id": c[0]},
        {"text": "[[tool:turn_on {\"name\":\"garage\"}]] [[tool:nope {}]] and", "conversation_id": c[1]},
        {"text": "what did I say? [[think:pondering]]", "conversation_id": c[0]},
        {"op": "append", "conversation_id": c[0], "content": "The washing machine has finished.",
         "metadata": {"source": "washer"}, "interface_message_id": "m%d" % it},
        {"text": "more", "conversation_id": c[0], "metadata": {"from": "anna"}},
        {"text": "turn off the kitchen light", "conversation_id": c[1]},
        {"text": "summary time", "conversation_id": c[0]},
        {"text": "once more", "conversation_id": c[1]},
        {"text": "to be cleared", "conversation_id": c[2]},
        {"text": "[[tool:turn_on {\"name\":\"hall\"}]]", "conversation_id": c[3]},
        {"text": "last", "conversation_id": c[0]},
    ]
    ops = [{"op": "history", "conversation_id": c[0]}, {"op": "list"},
           {"op": "query", "search": "light", "limit": 5}, {"op": "metrics"},
           {"op": "find", "conversation_id": c[0], "interface_message_id": "m%d" % it}]
    lines = []
    for t in turns:
        lines.append(t)
        if rng.random() < 0.3:
            lines.append(rng.choice(ops))
    lines.append({"op": "clear", "conversation_id": c[2]})
    lines.append({"text": "after the clear", "conversation_id": c[2]})
    return lines, c


def send(p, lines):
    """Write lines to a shim's stdin; one that has exited (create failed) reads no more."""
    try:
        p.stdin.write("".join(json.dumps(l) + "\n" for l in lines).encode())
        p.stdin.flush()
    except OSError:
        pass


def close_stdin(p):
    try:
        p.stdin.close()
    except OSError:
        pass


def check_turn(tid, msgs):
    """Problems of one stored turn (docs/history.md: the JSON you read back)."""
    if not msgs:
        return ["turn %s: no messages" % tid]
    if len(msgs) == 1:  # an appended message
        m = msgs[0]
        ok = m.get("role") in ("assistant", "user", "system") and isinstance(m.get("content"), str)
        return [] if ok and not m.get("tool_calls") else ["turn %s: bad lone message %r" % (tid, m)]
    p = []
    if msgs[0].get("role") != "user" or not isinstance(msgs[0].get("content"), (str, list)):
        p.append("turn %s: does not start with a user message: %r" % (tid, msgs[0]))
    last = msgs[-1]
    if last.get("role") != "assistant" or last.get("tool_calls") or not isinstance(
            last.get("content"), str):
        p.append("turn %s: does not end with an answer: %r" % (tid, last))
    p += ["turn %s: %s" % (tid, x) for x in tool_sequence_problems(msgs[1:])]
    for m in msgs[1:-1]:
        if m.get("role") not in ("assistant", "tool") or (
                m.get("role") == "assistant" and not m.get("tool_calls")):
            p.append("turn %s: stray message inside the turn: %r" % (tid, m))
    return p


class Iteration:
    def __init__(self, soak, it):
        self.soak, self.it = soak, it
        self.rng = random.Random(soak.seed * 1000003 + it)
        self.store = soak.stores[it % len(soak.stores)]
        self.one_in = self.rng.choice(RATES)
        self.after = self.rng.randrange(0, soak.budget)
        self.seed = self.rng.randrange(1, 1 << 32)
        self.concurrency = self.rng.choice([1, 1, 2, 4])
        self.stream = self.rng.random() < 0.5
        self.valgrind = False
        self.problems = []
        self.log = []

    def spec(self):
        return "seed=%d,one_in=%d,after=%d,report=1,stack=1" % (self.seed, self.one_in, self.after)

    def opts(self):
        o = options(self.soak.llm, max_history_turns=2, history_keep_turns=0, summarize=True,
                    stream=self.stream, request_timeout_ms=20000, turn_timeout_ms=30000,
                    history_lease_ms=3000)
        if self.store == "sqlite":
            o["history_store"] = "sqlite:" + os.path.join(self.soak.dir, "it%d.db" % self.it)
        elif self.store == "redis":
            o["history_store"] = self.soak.redis.url
            o["history_key_prefix"] = "it%d:" % self.it
        return o

    def shim(self, env_extra, valgrind=False):
        d = tempfile.mkdtemp(prefix="soak-", dir=self.soak.dir)
        args = harness._shim_args(d, self.opts(), "demo", self.concurrency, ())
        env = dict(os.environ)
        env.update(env_extra)
        if valgrind:
            args = VG + ["--log-file=" + os.path.join(d, "vg.log")] + args
        p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env)
        p.dir = d
        return p

    def run(self):
        lines, convs = script(self.it, self.rng)
        env = {"LD_PRELOAD": self.soak.lib, "PARLEY_FAILMALLOC": self.spec()}
        p = self.shim(env, self.valgrind)
        slow = 20 if self.valgrind else 1
        # every turn ends within turn_timeout_ms (30 s), waits for a Redis lease included
        out = Reader(p, time.time() + 75 * slow)
        send(p, lines)
        answered = out.until(len(lines))
        verify = []
        if answered and p.poll() is None:
            p.send_signal(signal.SIGUSR2)  # failures off: read the history back
            # a Redis connection hiredis lost while connecting waits 250 ms to reconnect
            time.sleep((0.3 if self.store == "redis" else 0.05) * slow)
            verify = [{"op": "history", "conversation_id": c} for c in convs] + [{"op": "list"}]
            send(p, verify)
        try:
            p.stdin.close()
        except OSError:
            pass
        out.until(len(lines) + len(verify))
        rc, err = out.finish()
        self.soak.failures_injected += self.count_failures(err)
        self.judge_exit(rc, err, out, len(lines), p)
        if rc == 0 and answered:
            results = {l.get("seq"): l for l in out.lines}
            self.problems += ["output line is not JSON: %r" % l["unparsable"]
                              for l in out.lines if "unparsable" in l]
            self.judge_lines(lines, results)
            stored = self.judge_history(convs, [results.get(len(lines) + 1 + i)
                                                for i in range(len(convs))], lines, results)
            if self.store != "memory" and not self.problems:
                self.reread(convs, stored)
        if self.problems:
            self.soak.fail(self, lines, out, err, p.dir)
        shutil.rmtree(p.dir, ignore_errors=True)

    @staticmethod
    def count_failures(err):
        for l in err.splitlines():
            if l.startswith("failmalloc: ") and " failed" in l:
                return int(l.split()[3])
        return 0

    def judge_exit(self, rc, err, out, n, p):
        if out.timed_out:
            self.problems.append("hang: no end within the timeout (stacks below)")
        elif rc is not None and rc < 0:
            culprit = third_party_crash(err, -rc)
            if culprit:
                self.soak.tolerated[culprit] += 1
            else:
                self.problems.append("killed by signal %d" % -rc)
        elif rc == 99 and self.valgrind:
            with open(os.path.join(p.dir, "vg.log")) as f:
                report = f.read()
            culprit = third_party_valgrind(report)
            if culprit:
                self.soak.tolerated[culprit] += 1
            else:
                self.problems.append("valgrind:\n" + report)
        elif rc == 127 and GLIBC_TLS in err:
            self.soak.tolerated["glibc: " + GLIBC_TLS] += 1
        elif rc in (1, 2):
            why = [l for l in err.splitlines() if l.startswith("parley-host")]
            self.soak.exits[(rc, why[0][:100] if why else "?")] += 1
        elif rc != 0:
            self.problems.append("exit %r" % rc)

    def judge_lines(self, lines, results):
        for seq in range(1, len(lines) + 1):
            r = results.get(seq)
            if r is None:
                self.problems.append("line %d got no answer" % seq)
                continue
            e = r.get("error")
            code = e.get("code") if isinstance(e, dict) else None
            if e is not None and code not in CODES:
                self.problems.append("line %d: undocumented error %r" % (seq, e))
            elif code in BAD_CODES:
                self.problems.append("line %d: %r" % (seq, e))
            what = lines[seq - 1].get("op", "turn")
            self.soak.codes[(what, code)] += 1
            if code not in (None, "no_memory") and len(self.soak.samples[(what, code)]) < 3:
                self.soak.samples[(what, code)].append(e.get("message", "")[:200])

    def judge_history(self, convs, reads, lines, results):
        """Checks the in-process read back; returns {conversation: [turn ids]}."""
        stored, every = {}, set()
        for c, r in zip(convs, reads):
            if r is None:
                self.problems.append("no read back of %s" % c)
                continue
            if r.get("error"):
                if r["error"].get("code") != "not_found":
                    self.problems.append("read back of %s: %r" % (c, r["error"]))
                stored[c] = []
                continue
            turns = r["result"].get("turns", [])
            stored[c] = [t.get("turn_id") for t in turns]
            every.update(stored[c])
            for t in turns:
                self.problems += check_turn(t.get("turn_id"), t.get("messages"))
        cleared = convs[2]
        for seq, l in results.items():
            if seq is None or seq > len(lines) or "turn_id" not in l or l.get("turn_id") is None:
                continue
            src = lines[seq - 1]
            if src.get("op") not in (None, "append"):
                continue
            conv = src["conversation_id"]
            if l.get("error") is None and l["turn_id"] not in every:
                # a turn of the cleared conversation before the clear may be gone, rightly
                before_clear = conv == cleared and src.get("text") != "after the clear"
                if not before_clear and stored.get(conv) is not None:
                    self.problems.append("line %d: turn %s succeeded but is not stored"
                                         % (seq, l["turn_id"]))
            elif l.get("error") is not None and l["turn_id"] in every:
                self.problems.append("line %d: turn %s failed (%s) but is stored"
                                     % (seq, l["turn_id"], l["error"].get("code")))
        return stored

    def reread(self, convs, stored):
        """A second process, without failures, reads the store and goes on in each conversation."""
        p = self.shim({})
        out = Reader(p, time.time() + 60)
        lines = [{"op": "history", "conversation_id": c} for c in convs]
        lines += [{"text": "and now?", "conversation_id": c} for c in convs if stored.get(c)]
        send(p, lines)
        close_stdin(p)
        out.until(len(lines))
        rc, err = out.finish()
        if rc != 0 or out.timed_out:
            self.problems.append("re-read: exit %r: %s" % (rc, err[-2000:]))
            return
        res = {l.get("seq"): l for l in out.lines}
        for i, c in enumerate(convs):
            r = res.get(i + 1, {})
            ids = [t.get("turn_id") for t in (r.get("result") or {}).get("turns", [])]
            if ids != stored.get(c, []):
                self.problems.append("re-read of %s: turns %r, the failing process read %r"
                                     % (c, ids, stored.get(c)))
        for seq in range(len(convs) + 1, len(lines) + 1):
            if (res.get(seq) or {}).get("error") is not None or seq not in res:
                self.problems.append("re-read: the turn of line %d failed: %r"
                                     % (seq, res.get(seq)))


# Crashes of a library of others under out of memory, known and not Parley's doing: the
# first frame of failmalloc's stack that is neither failmalloc's nor libc's is theirs.
# hiredis 0.14: its allocator aborts on out of memory (HIREDIS_OOM_HANDLER), and
# redisBufferWrite reads the length of the sdsempty() it could not allocate (both fixed in
# hiredis 1.0).
THIRD_PARTY = ("libhiredis",)
# libcurl 7.88's singlesocket(): when adding a transfer to a socket's hash fails it destroys
# that hash (0 slots) but keeps the socket's entry, whose next lookup divides by zero.
LIBCURL_SIGFPE = "libcurl 7.88: a socket's transfer hash used after its destruction (SIGFPE)"
# glibc's dynamic loader ends the process (exit 127) when it cannot allocate a thread's
# storage for a dlopen()ed library's thread-local variables.
GLIBC_TLS = "cannot allocate memory for thread-local data"


def third_party_valgrind(report):
    """What a valgrind report found, when every error in it is a known one of a library of
    others under out of memory, else None:
    - hiredis 0.14's redisFormatSdsCommandArgv leaks its empty command when growing it fails
      (sdsMakeRoomFor's NULL overwrites it);
    - libgnutls's library constructor leaks when an allocation fails in it;
    - OpenSSL's initialisation (OPENSSL_init_ssl from curl_global_init) leaks likewise."""
    blocks, cur = [], []
    for line in report.splitlines():
        body = line.split("== ", 1)[1] if line.startswith("==") and "== " in line else ""
        if not body.strip():
            if cur:
                blocks.append("\n".join(cur))
            cur = []
        else:
            cur.append(body)
    if cur:
        blocks.append("\n".join(cur))
    kinds = ("points to unaddressable", "Invalid ", "uninitialised", "definitely lost in",
             "indirectly lost in", "Mismatched", "overlap")
    def head(block):  # its first line, after valgrind's "Thread N:"
        lines = [l for l in block.splitlines() if not l.startswith("Thread ")]
        return lines[0] if lines else ""

    errors = [b for b in blocks if any(k in head(b) for k in kinds)]
    seen = set()
    for e in errors:
        if "lost in" in e and "redisFormatSdsCommandArgv" in e:
            seen.add("hiredis 0.14: redisFormatSdsCommandArgv leaks its command")
        elif "lost in" in e and "curl_global_init" in e and "libcrypto" in e:
            seen.add("OpenSSL: its initialisation (from curl_global_init) leaks when it runs "
                     "short")
        elif "lost in" in e and "call_init (dl-init.c" in e and "libgnutls" in e:
            # parley.so has no constructor: this is libgnutls's own (a dependency of
            # libcurl's) when one of its allocations fails while dlopen() runs it
            seen.add("libgnutls: its constructor leaks (libtasn1 tree) when it runs short")
        else:
            return None
    return " + ".join(sorted(seen)) + " (valgrind)" if seen else None


def third_party_crash(err, sig):
    """The library a crash came from, when failmalloc's stack shows it is one of THIRD_PARTY
    (libcurl: only its division by zero, see LIBCURL_SIGFPE)."""
    if "failmalloc: fatal signal, stack:" not in err:
        return None
    stack = err.split("failmalloc: fatal signal, stack:", 1)[1].splitlines()[1:]
    for frame in stack:
        if not re.search(r"\[0x[0-9a-f]+\]$", frame):
            continue  # another thread's output between the frames
        if "failmalloc.so" in frame or "libc.so" in frame:
            continue
        lib = os.path.basename(frame.split("(")[0])
        fn = frame.split("(")[1].split(")")[0] if "(" in frame else ""
        if "libcurl" in lib and sig == signal.SIGFPE:
            return LIBCURL_SIGFPE
        return "%s %s" % (lib, fn) if any(t in lib for t in THIRD_PARTY) else None
    return None


class Reader:
    """Reads a shim's stdout lines without blocking past a deadline."""

    def __init__(self, proc, deadline):
        self.p, self.deadline = proc, deadline
        self.buf, self.lines, self.raw = b"", [], []
        self.timed_out = False
        self.eof = False
        self.stacks = ""

    def until(self, n):
        """Read until n answer lines came; False on EOF or timeout."""
        import select
        fd = self.p.stdout.fileno()
        while len(self.lines) < n:
            if self.eof:
                return False
            left = self.deadline - time.time()
            if left <= 0:
                self.timed_out = True
                return False
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                self.eof = True
                continue
            self.buf += chunk
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                self.raw.append(line.decode(errors="replace"))
                try:
                    self.lines.append(json.loads(line))
                except ValueError:
                    self.lines.append({"unparsable": self.raw[-1]})
        return True

    def finish(self):
        """Waits for the exit (dumping every thread's stack on a hang); returns (rc, stderr).
        Lines still unanswered when the input has ended are told apart from a hang: the
        shim then has 30 s more to exit."""
        try:
            self.p.wait(timeout=max(30, self.deadline - time.time()))
            self.timed_out = False
        except subprocess.TimeoutExpired:
            self.timed_out = True
            if shutil.which("gdb"):
                self.stacks = subprocess.run(
                    ["gdb", "-p", str(self.p.pid), "-batch", "-ex", "thread apply all bt"],
                    capture_output=True, text=True, timeout=120).stdout
            self.p.kill()
            self.p.wait()
        err = self.p.stderr.read().decode(errors="replace")
        self.p.stdout.close()
        self.p.stderr.close()
        return self.p.returncode, err + self.stacks


class Soak:
    def __init__(self, args):
        self.seconds, self.seed = args.seconds, args.seed
        self.lib = os.path.abspath(args.lib)
        self.out = os.path.abspath(args.out)
        self.valgrind_every = args.valgrind_every
        self.only = set(args.only or [])
        self.fixed_budget = args.budget
        self.stores = args.stores.split(",")
        self.codes, self.exits = collections.Counter(), collections.Counter()
        self.samples = collections.defaultdict(list)
        self.failures_injected = 0
        self.tolerated = collections.Counter()
        self.failed = 0
        self.budget = 1

    def fail(self, it, lines, out, err, d):
        self.failed += 1
        dest = os.path.join(self.out, "it%d" % it.it)
        os.makedirs(dest, exist_ok=True)
        with open(os.path.join(dest, "report.txt"), "w") as f:
            f.write("store %s, PARLEY_FAILMALLOC=%s, concurrency %d, stream %s%s\n\n"
                    % (it.store, it.spec(), it.concurrency, it.stream,
                       ", under valgrind" if it.valgrind else ""))
            f.write("\n".join(it.problems) + "\n\n--- input\n")
            f.write("".join(json.dumps(l) + "\n" for l in lines))
            f.write("\n--- output\n" + "\n".join(out.raw) + "\n\n--- stderr\n" + err)
        shutil.copy(os.path.join(d, "options.json"), dest)
        print("FAIL it%d (%s, %s): %s\n  details: %s" % (it.it, it.store, it.spec(),
              "; ".join(p.splitlines()[0] for p in it.problems[:5]), dest), flush=True)

    def measure(self):
        """Allocations of a whole run without failures: `after` is drawn below it."""
        it = Iteration(self, 0)
        it.one_in = 0
        lines, _ = script(0, it.rng)
        p = it.shim({"LD_PRELOAD": self.lib, "PARLEY_FAILMALLOC": "report=1"})
        out = Reader(p, time.time() + 60)
        send(p, lines)
        close_stdin(p)
        out.until(len(lines))
        rc, err = out.finish()
        shutil.rmtree(p.dir, ignore_errors=True)
        n = [l for l in err.splitlines() if l.startswith("failmalloc: ")]
        if rc != 0 or not n:
            sys.exit("oom_soak: a run without failures failed (rc %r): %s" % (rc, err[-2000:]))
        return int(n[0].split()[1])

    def main(self):
        self.dir = tempfile.mkdtemp(prefix="parley-oom-soak-")
        start = time.time()
        with FakeLLM() as self.llm, RedisServer() as self.redis:
            self.budget = self.fixed_budget or self.measure()
            print("oom_soak: %d s, seed %d; a run without failures makes %d allocations"
                  % (self.seconds, self.seed, self.budget), flush=True)
            it = 0
            while time.time() - start < self.seconds:
                it += 1
                if self.only and it not in self.only:
                    if it > max(self.only):
                        break
                    continue
                i = Iteration(self, it)
                i.valgrind = self.valgrind_every > 0 and it % self.valgrind_every == 0
                i.run()
                if it % 25 == 0:
                    print("oom_soak: %d iterations, %d failures injected, %d failed, %d s"
                          % (it, self.failures_injected, self.failed, time.time() - start),
                          flush=True)
        shutil.rmtree(self.dir, ignore_errors=True)
        print("\noom_soak: %d iterations in %d s, %d allocation failures injected, %d failed"
              % (it, time.time() - start, self.failures_injected, self.failed))
        print("results (line kind, error code): count  [messages of codes other than no_memory]")
        for k, n in sorted(self.codes.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
            print("  %-10s %-16s %6d  %s" % (k[0], k[1] or "ok", n, self.samples.get(k, "")))
        for what, n in sorted(self.tolerated.items()):
            print("  tolerated crash x%d: %s" % (n, what))
        for (rc, why), n in sorted(self.exits.items()):
            print("  exit %d x%d: %s" % (rc, n, why))
        return 1 if self.failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("seconds", type=int, nargs="?", default=120)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--lib", required=True, help="failmalloc.so")
    ap.add_argument("--out", default="oom-soak-failures", help="where failing iterations go")
    ap.add_argument("--valgrind-every", type=int, default=0,
                    help="run every Nth iteration under valgrind (0: never)")
    ap.add_argument("--stores", default="memory,sqlite,redis",
                    help="the stores to soak, in turn (default memory,sqlite,redis)")
    ap.add_argument("--budget", type=int, default=0,
                    help="allocations of a run without failures, as a run printed it (with --only)")
    ap.add_argument("--only", type=int, action="append",
                    help="run only iteration N of this seed (repeatable): a failure again")
    sys.exit(Soak(ap.parse_args()).main())


if __name__ == "__main__":
    main()
