#!/usr/bin/env python3
"""bench/context_bench.py -- what a long conversation costs the server's prompt cache.

One deterministic 200-turn conversation (mixed message lengths, some non-ASCII, a tool call
every few turns) goes through parley-host --jsonl against parley-fake-llm, whose prompt model
(tests/fake-llm/README.md, "The prompt model") counts each request's tokens, matches them
against a llama.cpp-like or Anthropic-like prompt cache and logs what it found.  Each context
policy is run on the same conversation:

  old   0.1's sliding window: max_history_turns 20, no token budget
  new   the context engine: context_window (the server's n_ctx), context_reserve, summaries
        (only where the plugin knows these options; else reported as not available)

Reported per policy and cache (and per turn with --per-turn):
  prompt      prompt tokens sent (all requests of the turn)
  evaluated   prompt tokens the server had to evaluate (not read from its cache)
  new         tokens that are new in the turn: messages no earlier request carried (the user
              message, tool calls and results, the previous answer), rendered as the fake does
  eval/new    evaluated / new: 1.0 is the physical limit
  max prompt  the largest prompt, against the budget (window - reserve)
  breaks      turn requests that did not extend the conversation's previous request (its
              system, tools and messages, breakpoints and Parley's turn note after the user's
              text aside: it is sent once, never stored); in brackets the unplanned ones:
              breaks less the plugin's planned cuts (metric context_cuts, where it has one).
              A summary request in between is no break, but what it did to the server's
              cache shows in the tokens evaluated.
  summaries   summary requests (those that are not one of the conversation's turns) and their
              evaluated tokens, included in the totals above

  python3 bench/context_bench.py [--build build] [--old-build DIR] [--turns 200] [--seed 23]
                                 [--n-ctx 16384] [--extra]
                                 [--cache llamacpp,anthropic] [--policy old,new] [--per-turn]
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TAG = re.compile(r"^\[bench-turn (\d+)\] ")
WORDS = ("light kitchen living room temperature heating window door sensor evening morning "
         "please turn check status schedule music volume garage garden porch lamp thermostat "
         "bedroom bathroom humidity alarm timer reminder weather tomorrow today dinner").split()
EXTRA = ["Grüße", "café", "Müller", "naïve", "São Paulo", "Zürich", "ölçü", "日本"]


# ---- the fake's tokenizer and rendering (tests/fake-llm/prompt.c), for "new" tokens ----

def is_alnum(b):
    return 48 <= b <= 57 or 65 <= b <= 90 or 97 <= b <= 122


def tokens(text):
    s = text.encode()
    n, i, count = len(s), 0, 0
    while i < n:
        start = i
        if is_alnum(s[i]) or (s[i] == 32 and i + 1 < n and is_alnum(s[i + 1])):
            i += 1
            while i < n and i - start < 6 and is_alnum(s[i]):
                i += 1
        else:
            i += 1
        count += 1
    return count


def render_message(m):
    """A message of either dialect, about as the fake renders it."""
    out = "<|%s|>\n" % m.get("role", "user")
    content = m.get("content")
    if isinstance(content, str):
        out += content + "\n" if content else ""
    for part in content if isinstance(content, list) else []:
        kind = part.get("type")
        if kind == "text":
            out += part.get("text", "") + "\n"
        elif kind == "tool_use":
            out += "<|call|>%s %s\n" % (part.get("name"), json.dumps(part.get("input"),
                                                                    separators=(",", ":")))
        elif kind == "tool_result":
            c = part.get("content")
            out += "<|result|>%s\n" % (c if isinstance(c, str) else
                                       "".join(b.get("text", "") for b in c or []))
    for call in m.get("tool_calls") or []:
        fn = call.get("function", {})
        out += "<|call|>%s %s\n" % (fn.get("name"), fn.get("arguments"))
    return out + "<|end|>\n"


NOTE_HEADING = "[Instructions for this turn, from the system, not from the user]\n"


def split_note(m):
    """A user message without Parley's turn note (the volatile part of the prompt, after the
    user's text: docs/history.md), and the note's text ("" when it has none)."""
    if m.get("role") != "user":
        return m, ""
    c = m.get("content")
    if isinstance(c, str) and NOTE_HEADING in c:
        at = c.index(NOTE_HEADING)
        return dict(m, content=c[:at].rstrip("\n")), c[at:]
    if isinstance(c, list):
        notes = [p for p in c if p.get("type") == "text" and
                 p.get("text", "").lstrip("\n").startswith(NOTE_HEADING)]
        if notes:
            return dict(m, content=[p for p in c if p not in notes]), notes[0]["text"]
    return m, ""


def signature(m):
    def strip(v):
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if k not in ("cache_control", "id",
                                                                   "tool_call_id", "tool_use_id")}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v
    return json.dumps(strip(m), sort_keys=True)


# ---- the conversation ----

def conversation(turns, seed, extra=False):
    """With extra: each turn has an extra_system_prompt that changes every turn, as Home
    Assistant's does (the time, 40 s later each turn)."""
    rnd = random.Random(seed)
    lines = []
    for t in range(turns):
        kind = rnd.random()
        n = rnd.randint(4, 15) if kind < 0.6 else rnd.randint(30, 70) if kind < 0.9 else \
            rnd.randint(150, 300)
        words = [rnd.choice(WORDS) for _ in range(n)]
        if rnd.random() < 0.2:
            words.insert(rnd.randrange(len(words) + 1), rnd.choice(EXTRA))
        text = "[bench-turn %03d] %s" % (t, " ".join(words))
        if t % 4 == 3:  # a tool call every fourth turn
            text += ' [[tool:turn_on {"name":"%s"}]]' % rnd.choice(WORDS)
        line = {"text": text, "conversation_id": "bench"}
        if extra:
            s = 9 * 3600 + 40 * t
            line["extra_system_prompt"] = "Current time is %02d:%02d:%02d. The user is in the " \
                "kitchen." % (s // 3600, s // 60 % 60, s % 60)
        lines.append(line)
    return lines


# ---- one run ----

def run(args, cache, policy):
    build = os.path.abspath(args.build)
    fake_bin = args.fake or os.path.join(build, "tests", "fake-llm", "parley-fake-llm")
    # the old policy may run another build's plugin (0.1's, whose max_history_turns slides)
    # against the same fake server
    plugin_build = os.path.abspath(args.old_build or build) if policy == "old" else build
    shim = os.path.join(plugin_build, "host-shim", "parley-host")
    plugin = os.path.join(plugin_build, "plugin", "parley.so")
    with tempfile.TemporaryDirectory(prefix="parley-ctx-bench-") as d:
        log = os.path.join(d, "requests.jsonl")
        port_file = os.path.join(d, "port")
        fake = subprocess.Popen([fake_bin, "--port", "0", "--port-file", port_file, "--log", log,
                                 "--quiet", "--cache", cache, "--n-ctx", str(args.n_ctx),
                                 "--honor-max-tokens", *args.fake_args.split()],
                                stdout=subprocess.DEVNULL)
        try:
            deadline = time.time() + 10
            while not os.path.exists(port_file) and time.time() < deadline:
                time.sleep(0.01)
            port = int(open(port_file).read())
            provider = "anthropic" if cache == "anthropic" else "openai"
            opts = {"provider": provider, "model": "fake-model",
                    "base_url": "http://127.0.0.1:%d%s" % (port, "/v1" if provider == "openai"
                                                            else ""),
                    "prompt": "You are a helpful home assistant. " * 40,
                    "max_tokens": 256, "request_timeout_ms": 30000}
            if provider == "anthropic":
                opts["api_key"] = "bench"
            if policy == "old":
                opts.update({"max_history_turns": 20})
                opts.update(json.loads(args.old_options))
            else:
                opts.update({"context_window": args.n_ctx, "context_reserve": args.reserve,
                             "summarize": True})
                opts.update(json.loads(args.new_options))
            opt_path = os.path.join(d, "options.json")
            with open(opt_path, "w") as f:
                json.dump(opts, f)
            lines = conversation(args.turns, args.seed, args.extra) + [{"op": "metrics"}]
            res = subprocess.run([shim, "--plugin", plugin, "--options", opt_path, "--jsonl",
                                  "--tools", "demo"],
                                 input="".join(json.dumps(l) + "\n" for l in lines),
                                 capture_output=True, text=True, timeout=1800)
            if res.returncode != 0 and not res.stdout.strip():
                return {"unavailable": res.stderr.strip().splitlines()[-1:] or ["failed"]}
            out = [json.loads(l) for l in res.stdout.splitlines() if l.strip()]
            requests = [json.loads(l) for l in open(log) if l.strip()]
        finally:
            fake.terminate()
            fake.wait()
    r = measure(args, out, requests, policy)
    r["shim_exit"] = res.returncode  # not 0 after it ran: it failed (crashed, leaked)
    if res.returncode:
        r["shim_stderr"] = res.stderr[-2000:]
    return r


def prompt_parts(body):
    """A request's prompt as a list: its system and tools, then its messages, each as a
    signature (cache_control and ids left out: a breakpoint that moves changes no prefix)."""
    parts = [signature({"system": body.get("system")}), signature({"tools": body.get("tools")})]
    return parts + [signature(split_note(m)[0]) for m in body.get("messages") or []]


def last_user_text(body):
    """The last user message's text (Anthropic: skipping user messages of tool results)."""
    for m in reversed(body.get("messages") or []):
        if m.get("role") == "user":
            c = m.get("content")
            if isinstance(c, list):
                texts = [p.get("text", "") for p in c if p.get("type") == "text"]
                if not texts:
                    continue
                return texts[0]
            return c or ""
    return ""


def measure(args, out, requests, policy):
    turns = [{"prompt": 0, "evaluated": 0, "new": 0, "requests": 0, "breaks": 0}
             for _ in range(args.turns)]
    seen = set()
    summaries = {"count": 0, "prompt": 0, "evaluated": 0}
    max_prompt, breaks, server_breaks, overflows = 0, 0, 0, 0
    previous = None  # the conversation's previous request, as its parts' signatures
    for r in requests:
        if "prompt_tokens" not in r:
            continue  # a discovery request, or one refused before the prompt model
        body = r.get("body") or {}
        m = TAG.match(last_user_text(body))
        max_prompt = max(max_prompt, r["prompt_tokens"])
        overflows += bool(r.get("overflow"))
        server_breaks += r.get("extends_previous") is False
        if not m:
            summaries["count"] += 1
            summaries["prompt"] += r["prompt_tokens"]
            summaries["evaluated"] += r["evaluated_tokens"]
            continue
        # a break: the request does not extend the conversation's previous request (what
        # another request in between did to the server's cache shows in `evaluated`)
        current = prompt_parts(body)
        broke = previous is not None and current[:len(previous)] != previous
        previous = current
        breaks += broke
        t = turns[int(m.group(1))]
        t["requests"] += 1
        t["prompt"] += r["prompt_tokens"]
        t["evaluated"] += r["evaluated_tokens"]
        t["breaks"] += broke
        new = tokens("<|assistant|>\n")
        parts = list(body.get("messages") or [])
        if body.get("tools"):  # the tools and (Anthropic) the system blocks are prompt too
            parts.insert(0, {"role": "tools", "content": json.dumps(body["tools"])})
        if "system" in body:
            system = body["system"]
            parts.insert(0, {"role": "system", "content": system if isinstance(system, str)
                             else [dict(b, type="text") for b in system]})
        for msg in parts:
            msg, note = split_note(msg)  # the note is new on every turn it is sent
            new += tokens(note) if note else 0
            sig = signature(msg)
            if sig not in seen:
                seen.add(sig)
                new += tokens(render_message(msg))
        t["new"] += new
    results = [l for l in out if "steps" in l]
    failed = [l for l in results if l.get("error")]
    metrics = next((l.get("result") for l in out if l.get("op") == "metrics"), {}) or {}
    planned = {k: v for k, v in metrics.items()
               if any(w in k for w in ("context", "summar", "cache_break", "overflow"))}
    cuts = metrics.get("context_cuts", 0) or 0
    done = [t for t in turns if t["requests"]]
    total = lambda k: sum(t[k] for t in done)
    evaluated_all = total("evaluated") + summaries["evaluated"]
    return {"turns": done, "summaries": summaries, "max_prompt": max_prompt,
            "breaks": breaks, "planned_cuts": cuts, "unplanned_breaks": max(breaks - cuts, 0),
            "server_breaks": server_breaks,
            "overflows": overflows, "failed": len(failed),
            "failed_codes": sorted({l["error"]["code"] for l in failed}),
            "prompt_avg": (total("prompt") + summaries["prompt"]) / max(len(done), 1),
            "evaluated_avg": evaluated_all / max(len(done), 1),
            "new_avg": total("new") / max(len(done), 1),
            "ratio": evaluated_all / max(total("new"), 1),
            "budget": args.n_ctx - args.reserve if policy == "new" else None,
            "plugin_metrics": planned}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(SRC, "build"))
    ap.add_argument("--old-build", help="the build whose plugin runs the old policy (a build of "
                    "0.1 / main before the context engine); default: --build")
    ap.add_argument("--fake", help="the parley-fake-llm to run (default: --build's)")
    ap.add_argument("--fake-args", default="", help="more options for the fake server, e.g. "
                    "\"--cache-ram 8\" (llama.cpp's RAM prompt cache)")
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--seed", type=int, default=23)
    ap.add_argument("--n-ctx", type=int, default=16384)
    ap.add_argument("--reserve", type=int, default=1024)
    ap.add_argument("--cache", default="llamacpp,anthropic")
    ap.add_argument("--policy", default="old,new")
    ap.add_argument("--old-options", default="{}", help="JSON merged into the old policy's options")
    ap.add_argument("--new-options", default="{}", help="JSON merged into the new policy's options")
    ap.add_argument("--extra", action="store_true", help="an extra_system_prompt that changes "
                    "every turn (Home Assistant's time)")
    ap.add_argument("--per-turn", action="store_true")
    ap.add_argument("--json", help="write every figure to this file")
    args = ap.parse_args()
    everything = {}
    print("context_bench: %d turns, seed %d, n_ctx %d, reserve %d (new policy)"
          % (args.turns, args.seed, args.n_ctx, args.reserve))
    print("%-9s %-6s %8s %9s %6s %8s %13s %15s %6s %s" % (
        "cache", "policy", "prompt", "evaluated", "new", "eval/new", "max prompt",
        "breaks (unpl.)", "failed", "summaries (n, evaluated)"))
    for cache in args.cache.split(","):
        for policy in args.policy.split(","):
            r = run(args, cache, policy)
            everything["%s/%s" % (cache, policy)] = r
            if "unavailable" in r:
                print("%-9s %-6s not available in this build: %s" % (cache, policy,
                                                                      r["unavailable"][0]))
                continue
            budget = " / %d" % r["budget"] if r["budget"] else ""
            print("%-9s %-6s %8.0f %9.0f %6.0f %8.2f %13s %15s %6d %d, %d" % (
                cache, policy, r["prompt_avg"], r["evaluated_avg"], r["new_avg"], r["ratio"],
                "%d%s" % (r["max_prompt"], budget),
                "%d (%d)" % (r["breaks"], r["unplanned_breaks"]), r["failed"],
                r["summaries"]["count"], r["summaries"]["evaluated"]))
            if r["failed_codes"]:
                print("          failed turns: %s" % ", ".join(r["failed_codes"]))
            if r["plugin_metrics"]:
                print("          plugin metrics: %s" % json.dumps(r["plugin_metrics"]))
            if args.per_turn:
                print("          turn  prompt evaluated    new  eval/new breaks")
                for i, t in enumerate(r["turns"]):
                    print("          %4d %7d %9d %6d %9.2f %6d" % (
                        i, t["prompt"], t["evaluated"], t["new"],
                        t["evaluated"] / max(t["new"], 1), t["breaks"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=1)
    broken = [k for k, r in everything.items() if r.get("shim_exit")]
    for k in broken:
        print("%s: parley-host exited %d: %s" % (k, everything[k]["shim_exit"],
                                                  everything[k]["shim_stderr"]), file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
