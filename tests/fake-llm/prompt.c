/* The prompt model: what a real server does with a prompt before it answers.
 *
 * Every chat request is rendered to one canonical text (the fake's chat
 * template), counted by the fake's tokenizer, checked against the context
 * window (--n-ctx), and matched against a prompt cache the way the server
 * named by --cache keeps one:
 *
 *   llamacpp   per slot, the longest common prefix (in tokens) with what the
 *              slot holds: its previous prompt and the answer it generated
 *              (llama.cpp tools/server/server-context.cpp: get_available_slot,
 *              cache_prompt; Ollama's runner does the same per slot)
 *   anthropic  prefixes cached only at cache_control breakpoints, read back at
 *              block boundaries up to 20 blocks before a breakpoint, kept 5
 *              minutes from their last use, none shorter than --cache-min
 *              (docs.anthropic.com, "Prompt caching")
 *   openai     automatic: the longest prefix of any recent prompt, from 1024
 *              tokens up in steps of 128 (platform.openai.com, "Prompt caching")
 *   none       nothing is ever cached
 *
 * The canonical text (README: "The prompt model"):
 *   tools      "<|tools|>\n" JSON "\n" (Anthropic: one "<|tool|>" JSON "\n" block per tool)
 *   messages   "<|ROLE|>\n" then the content: text + "\n" per text part, "<|call|>NAME ARGS\n"
 *              per tool call, "<|image|>\n" per image; then "<|end|>\n"
 *   the end    "<|assistant|>\n" (the generation prompt)
 * The tokenizer: a run of ASCII letters and digits, with one space before it,
 * is cut into tokens of at most 6 bytes; every other byte (punctuation, a
 * newline, each byte of a non-ASCII character) is a token of its own.  So it
 * counts about chars/4 on English prose but about twice that on JSON, and 2-4
 * tokens per non-ASCII character: an estimate that is plain chars/4 must
 * learn from the figures the fake reports. */
#include "fakellm.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "The system checks for cache hits at block boundaries up to 20 blocks before each explicit
   breakpoint; with no match there it moves on to the previous explicit breakpoint"
   (platform.claude.com/docs/en/build-with-claude/prompt-caching, "lookback window") */
#define ANTHROPIC_LOOKBACK 20
#define OPENAI_MIN 1024        /* OpenAI: no caching below this many tokens ... */
#define OPENAI_STEP 128        /* ... and cached counts in steps of this many */
#define OPENAI_KEEP 64         /* recent prompts remembered (the oldest is forgotten) */
#define SLOT_SIMILARITY 0.10   /* llama.cpp --slot-prompt-similarity default */

/* ------------------------------------------------------------ tokenizer */

static bool is_alnum(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* r->ends from r->text: where each token ends. */
static void tokenize(struct rendered *r)
{
    const unsigned char *s = (const unsigned char *)r->text.data;
    size_t n = r->text.len, i = 0;
    r->ntok = 0;
    while (i < n) {
        size_t start = i;
        if (is_alnum(s[i]) || (s[i] == ' ' && i + 1 < n && is_alnum(s[i + 1]))) {
            i++;
            while (i < n && i - start < 6 && is_alnum(s[i]))
                i++;
        } else {
            i++;
        }
        if (r->ntok == r->cap) {
            r->cap = r->cap ? r->cap * 2 : 256;
            r->ends = xrealloc(r->ends, r->cap * sizeof *r->ends);
        }
        r->ends[r->ntok++] = i;
    }
}

/* Tokens a and b share from the start (both tokenized). */
static size_t token_lcp(const struct rendered *a, const struct rendered *b)
{
    size_t bytes = 0, n = a->text.len < b->text.len ? a->text.len : b->text.len;
    while (bytes < n && a->text.data[bytes] == b->text.data[bytes])
        bytes++;
    size_t k = 0;
    while (k < a->ntok && k < b->ntok && a->ends[k] == b->ends[k] && b->ends[k] <= bytes)
        k++;
    return k;
}

/* Tokens of r that end at or before byte `end`. */
static size_t tokens_before(const struct rendered *r, size_t end)
{
    size_t lo = 0, hi = r->ntok;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (r->ends[mid] <= end)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

void rendered_free(struct rendered *r)
{
    buf_free(&r->text);
    free(r->ends);
    free(r->blocks);
    memset(r, 0, sizeof *r);
}

/* ------------------------------------------------------------ rendering */

static void block_end(struct rendered *r, bool breakpoint)
{
    if (r->nblocks == r->bcap) {
        r->bcap = r->bcap ? r->bcap * 2 : 32;
        r->blocks = xrealloc(r->blocks, r->bcap * sizeof *r->blocks);
    }
    r->blocks[r->nblocks].end = r->text.len;
    r->blocks[r->nblocks].breakpoint = breakpoint;
    r->nblocks++;
}

static void put_json(buf_t *b, const json_t *v)
{
    size_t len;
    char *s = json_dump_compact(v, &len);
    buf_append(b, s, len);
    free(s);
}

static void put_call(buf_t *b, const char *name, const char *args)
{
    buf_printf(b, "<|call|>%s %s\n", name ? name : "", args ? args : "{}");
}

/* A Chat Completions content: a string or parts. */
static void put_chat_content(buf_t *b, const json_t *content)
{
    if (json_is_string(content) && json_string_length(content)) {
        buf_append(b, json_string_value(content), json_string_length(content));
        buf_puts(b, "\n");
    }
    size_t i;
    json_t *part;
    json_array_foreach(content, i, part) {
        const char *text = jstr_member(part, "text");
        if (text) {
            buf_puts(b, text);
            buf_puts(b, "\n");
        } else {
            buf_puts(b, "<|image|>\n");
        }
    }
}

void prompt_render_chat(const json_t *body, struct rendered *r)
{
    const json_t *tools = json_object_get(body, "tools");
    if (json_is_array(tools) && json_array_size(tools)) {
        buf_puts(&r->text, "<|tools|>\n");
        put_json(&r->text, tools);
        buf_puts(&r->text, "\n");
        block_end(r, false);
    }
    size_t i, k;
    json_t *m, *call;
    json_array_foreach(json_object_get(body, "messages"), i, m) {
        const char *role = chat_role_of(m);
        buf_printf(&r->text, "<|%s|>\n", role ? role : "user");
        put_chat_content(&r->text, json_object_get(m, "content"));
        json_array_foreach(json_object_get(m, "tool_calls"), k, call) {
            const json_t *fn = json_object_get(call, "function");
            put_call(&r->text, jstr_member(fn, "name"), jstr_member(fn, "arguments"));
        }
        buf_puts(&r->text, "<|end|>\n");
        block_end(r, false);
    }
    buf_puts(&r->text, "<|assistant|>\n");
    tokenize(r);
}

static bool has_cache_control(const json_t *o)
{
    return json_is_object(json_object_get(o, "cache_control"));
}

/* An Anthropic tool_result's content: a string or blocks. */
static void put_result(buf_t *b, const json_t *content)
{
    buf_puts(b, "<|result|>");
    if (json_is_string(content))
        buf_puts(b, json_string_value(content));
    size_t i;
    json_t *blk;
    json_array_foreach(content, i, blk) {
        if (jstr_member(blk, "text"))
            buf_puts(b, jstr_member(blk, "text"));
    }
    buf_puts(b, "\n");
}

/* One content block of an Anthropic message (thinking blocks count for nothing). */
static void put_anthropic_block(buf_t *b, const json_t *blk)
{
    const char *type = jstr_member(blk, "type");
    if (!type)
        return;
    if (strcmp(type, "text") == 0) {
        buf_puts(b, jstr_member(blk, "text") ? jstr_member(blk, "text") : "");
        buf_puts(b, "\n");
    } else if (strcmp(type, "tool_use") == 0) {
        char *args = json_dumps(json_object_get(blk, "input"), JSON_COMPACT | JSON_SORT_KEYS);
        put_call(b, jstr_member(blk, "name"), args);
        free(args);
    } else if (strcmp(type, "tool_result") == 0) {
        put_result(b, json_object_get(blk, "content"));
    } else if (strcmp(type, "image") == 0) {
        buf_puts(b, "<|image|>\n");
    }
}

void prompt_render_anthropic(const json_t *native, struct rendered *r)
{
    size_t i, k;
    json_t *t, *m, *blk;
    json_array_foreach(json_object_get(native, "tools"), i, t) {
        json_t *copy = json_deep_copy(t);
        json_object_del(copy, "cache_control"); /* a breakpoint changes no prefix */
        buf_puts(&r->text, "<|tool|>");
        put_json(&r->text, copy);
        buf_puts(&r->text, "\n");
        json_decref(copy);
        block_end(r, has_cache_control(t));
    }
    const json_t *sys = json_object_get(native, "system");
    if (json_is_string(sys)) {
        buf_printf(&r->text, "<|system|>\n%s\n", json_string_value(sys));
        block_end(r, false);
        buf_puts(&r->text, "<|end|>\n");
    }
    /* A block ends with its own content: the message's "<|end|>" after its last block
       belongs to what follows, so a block keeps its prefix whether or not another block
       follows it in its message (the cache covers the prompt "up to and including" the
       marked block). */
    json_array_foreach(sys, i, blk) {
        if (i == 0)
            buf_puts(&r->text, "<|system|>\n");
        buf_puts(&r->text, jstr_member(blk, "text") ? jstr_member(blk, "text") : "");
        buf_puts(&r->text, "\n");
        block_end(r, has_cache_control(blk));
        if (i + 1 == json_array_size(sys))
            buf_puts(&r->text, "<|end|>\n");
    }
    json_array_foreach(json_object_get(native, "messages"), i, m) {
        const json_t *content = json_object_get(m, "content");
        buf_printf(&r->text, "<|%s|>\n", jstr_member(m, "role") ? jstr_member(m, "role") : "user");
        if (json_is_string(content)) {
            buf_printf(&r->text, "%s\n", json_string_value(content));
            block_end(r, false);
            buf_puts(&r->text, "<|end|>\n");
            continue;
        }
        json_array_foreach(content, k, blk) {
            put_anthropic_block(&r->text, blk);
            block_end(r, has_cache_control(blk));
            if (k + 1 == json_array_size(content))
                buf_puts(&r->text, "<|end|>\n");
        }
    }
    /* top-level cache_control: the automatic breakpoint, on the last block */
    if (has_cache_control(native) && r->nblocks)
        r->blocks[r->nblocks - 1].breakpoint = true;
    buf_puts(&r->text, "<|assistant|>\n");
    tokenize(r);
}

/* The answer as the next prompt renders it after "<|assistant|>\n" (malloc'd). */
static char *render_reply(const struct chat_reply *rep, size_t *len)
{
    buf_t b = {0};
    if (rep->content && *rep->content) {
        buf_puts(&b, rep->content);
        buf_puts(&b, "\n");
    }
    for (size_t i = 0; i < rep->ncalls; i++)
        put_call(&b, rep->calls[i].name, rep->calls[i].args);
    buf_puts(&b, "<|end|>\n");
    return buf_take(&b, len);
}

/* ------------------------------------------------------------ caches */

struct slot {
    struct rendered held; /* the prompt and the answer generated after it */
    size_t prompt_len;    /* bytes of `held` that were the prompt */
    uint64_t last_used;   /* for the LRU choice */
    unsigned long gen;    /* bumped per prompt: a late answer for an older one is dropped */
};

struct anthropic_entry {
    uint64_t hash;
    size_t tokens;
    uint64_t expires_ms;
};

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static struct slot *slots;
static uint64_t slot_clock;
static struct rendered recent[OPENAI_KEEP]; /* openai: recent prompts */
static uint64_t recent_used[OPENAI_KEEP];
static struct rendered last_prompt;         /* the previous request's prompt (not llamacpp) */
static bool have_last;
static struct anthropic_entry *aentries;
static size_t naentries, aentries_cap;

/* dst becomes a copy of src's text and tokens (not its blocks: caches need none). */
static void copy_rendered(struct rendered *dst, const struct rendered *src)
{
    buf_free(&dst->text);
    buf_append(&dst->text, src->text.data, src->text.len);
    tokenize(dst);
}

static bool is_prefix(const struct rendered *prev, size_t prev_len, const struct rendered *r)
{
    return r->text.len >= prev_len && memcmp(prev->text.data, r->text.data, prev_len) == 0;
}

/* llama.cpp's get_available_slot: the idle slot whose cached tokens cover the largest
 * fraction of the new prompt, above --slot-prompt-similarity; else the least recently used
 * (the last of equals, as its `<=` picks).  *update_cache: the slot is about to lose most of
 * what it holds (chosen by LRU, or keeping under half of it): --cache-ram saves it first. */
static size_t choose_slot(const struct rendered *r, size_t *lcp, bool *update_cache)
{
    size_t best = SIZE_MAX;
    double best_sim = 0;
    for (size_t i = 0; i < g_cfg.slots; i++) {
        if (!slots[i].held.ntok)
            continue;
        size_t l = token_lcp(&slots[i].held, r);
        double sim = r->ntok ? (double)l / (double)r->ntok : 0;
        if (sim > best_sim && sim > SLOT_SIMILARITY) {
            best_sim = sim;
            best = i;
            *lcp = l;
        }
    }
    if (best != SIZE_MAX) {
        *update_cache = (double)*lcp / (double)slots[best].held.ntok < 0.5;
        return best;
    }
    for (size_t i = 0; i < g_cfg.slots; i++)
        if (best == SIZE_MAX || slots[i].last_used <= slots[best].last_used)
            best = i;
    *lcp = token_lcp(&slots[best].held, r);
    *update_cache = true;
    return best;
}

/* --cache-ram: llama.cpp's RAM prompt cache (server_prompt_cache).  prompt_save keeps what
 * the slot holds; prompt_load gives the slot the saved prompt that keeps more of itself and
 * covers more of the new prompt than the slot does, none that would keep under a quarter of
 * itself.  At most --cache-ram prompts are kept, the oldest dropped first. */
static struct rendered *ram;
static size_t nram;

static void ram_save(const struct rendered *held)
{
    if (nram == g_cfg.cache_ram) {
        rendered_free(&ram[0]);
        memmove(ram, ram + 1, (nram - 1) * sizeof *ram);
        memset(&ram[--nram], 0, sizeof *ram);
    }
    copy_rendered(&ram[nram++], held);
}

static void ram_load(struct slot *s, const struct rendered *r, size_t *lcp)
{
    double keep_best = (double)*lcp / (double)s->held.ntok;
    double sim_best = (double)*lcp / (double)r->ntok;
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < nram; i++) {
        size_t l = token_lcp(&ram[i], r);
        double keep = (double)l / (double)ram[i].ntok, sim = (double)l / (double)r->ntok;
        if (keep < 0.25) /* "don't trash large prompts" */
            continue;
        if (keep_best < keep && sim_best < sim) {
            keep_best = keep;
            sim_best = sim;
            best = i;
        }
    }
    if (best != SIZE_MAX) {
        copy_rendered(&s->held, &ram[best]);
        *lcp = token_lcp(&s->held, r);
    }
}

static void account_llamacpp(const struct rendered *r, struct prompt_stats *st)
{
    if (!slots)
        slots = calloc(g_cfg.slots, sizeof *slots);
    if (!ram && g_cfg.cache_ram)
        ram = calloc(g_cfg.cache_ram, sizeof *ram);
    size_t lcp = 0;
    bool update_cache = false;
    size_t i = choose_slot(r, &lcp, &update_cache);
    struct slot *s = &slots[i];
    st->slot = (int)i;
    st->extends = s->prompt_len ? is_prefix(&s->held, s->prompt_len, r) : -1;
    if (update_cache && g_cfg.cache_ram && s->held.ntok && r->ntok) {
        ram_save(&s->held);
        ram_load(s, r, &lcp);
    }
    /* at least one token is evaluated, for the logits ("we have to evaluate at least 1 token") */
    st->cached_tokens = lcp < r->ntok ? lcp : (r->ntok ? r->ntok - 1 : 0);
    copy_rendered(&s->held, r);
    s->prompt_len = r->text.len;
    s->last_used = ++slot_clock;
    st->gen = ++s->gen;
}

static uint64_t fnv(uint64_t h, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 0x100000001b3ULL;
    return h;
}

static struct anthropic_entry *anthropic_find(uint64_t hash, uint64_t now)
{
    for (size_t i = 0; i < naentries; i++)
        if (aentries[i].hash == hash && aentries[i].expires_ms > now)
            return &aentries[i];
    return NULL;
}

static void anthropic_put(uint64_t hash, size_t tokens, uint64_t now)
{
    struct anthropic_entry *e = anthropic_find(hash, now);
    if (!e) {
        for (size_t i = 0; i < naentries && !e; i++)
            if (aentries[i].expires_ms <= now)
                e = &aentries[i]; /* reuse an expired one */
        if (!e) {
            if (naentries == aentries_cap) {
                aentries_cap = aentries_cap ? aentries_cap * 2 : 64;
                aentries = xrealloc(aentries, aentries_cap * sizeof *aentries);
            }
            e = &aentries[naentries++];
        }
    }
    e->hash = hash;
    e->tokens = tokens;
    e->expires_ms = now + g_cfg.cache_ttl_ms; /* a hit or a write refreshes the lifetime */
}

static void account_anthropic(const struct rendered *r, struct prompt_stats *st)
{
    uint64_t now = now_ms();
    uint64_t *hashes = xmalloc((r->nblocks + 1) * sizeof *hashes);
    size_t *toks = xmalloc((r->nblocks + 1) * sizeof *toks);
    uint64_t h = 0xcbf29ce484222325ULL;
    size_t prev = 0, read = 0, last_bp = SIZE_MAX;
    for (size_t b = 0; b < r->nblocks; b++) {
        h = fnv(h, r->text.data + prev, r->blocks[b].end - prev);
        prev = r->blocks[b].end;
        hashes[b] = h;
        toks[b] = tokens_before(r, prev);
    }
    for (size_t b = 0; b < r->nblocks; b++) {
        if (!r->blocks[b].breakpoint)
            continue;
        last_bp = b;
        for (size_t j = b + 1; j-- > 0 && b - j <= ANTHROPIC_LOOKBACK;) {
            struct anthropic_entry *e = anthropic_find(hashes[j], now);
            if (e) {
                e->expires_ms = now + g_cfg.cache_ttl_ms;
                if (toks[j] > read)
                    read = toks[j];
                break;
            }
        }
    }
    for (size_t b = 0; b < r->nblocks; b++)
        if (r->blocks[b].breakpoint && toks[b] >= g_cfg.cache_min)
            anthropic_put(hashes[b], toks[b], now);
    if (last_bp != SIZE_MAX && toks[last_bp] >= g_cfg.cache_min && toks[last_bp] > read)
        st->cache_creation = toks[last_bp] - read;
    st->cached_tokens = read;
    free(hashes);
    free(toks);
}

static void account_openai(const struct rendered *r, struct prompt_stats *st)
{
    uint64_t now = now_ms();
    size_t best = 0, oldest = 0;
    for (size_t i = 0; i < OPENAI_KEEP; i++) {
        if (recent[i].ntok && recent_used[i] + g_cfg.cache_ttl_ms > now) {
            size_t l = token_lcp(&recent[i], r);
            if (l > best)
                best = l;
            if (l == recent[i].ntok)
                recent_used[i] = now;
        }
        if (recent_used[i] < recent_used[oldest])
            oldest = i;
    }
    st->cached_tokens = best < OPENAI_MIN ? 0 : OPENAI_MIN + (best - OPENAI_MIN) / OPENAI_STEP * OPENAI_STEP;
    if (st->cached_tokens >= r->ntok)
        st->cached_tokens = r->ntok ? r->ntok - 1 : 0;
    copy_rendered(&recent[oldest], r);
    recent_used[oldest] = now;
}

void prompt_account(const struct rendered *r, struct prompt_stats *st)
{
    pthread_mutex_lock(&cache_mu);
    st->valid = true;
    st->prompt_tokens = r->ntok;
    st->slot = -1;
    st->extends = -1;
    if (g_cfg.cache == CACHE_LLAMACPP) {
        account_llamacpp(r, st);
    } else {
        if (have_last)
            st->extends = is_prefix(&last_prompt, last_prompt.text.len, r);
        if (g_cfg.cache == CACHE_ANTHROPIC)
            account_anthropic(r, st);
        else if (g_cfg.cache == CACHE_OPENAI)
            account_openai(r, st);
        copy_rendered(&last_prompt, r);
        have_last = true;
    }
    st->evaluated = st->prompt_tokens - st->cached_tokens;
    pthread_mutex_unlock(&cache_mu);
}

void prompt_answered(const struct prompt_stats *st, const struct chat_reply *rep)
{
    if (!st->valid || st->slot < 0)
        return;
    size_t len;
    char *text = render_reply(rep, &len);
    pthread_mutex_lock(&cache_mu);
    struct slot *s = &slots[st->slot];
    if (s->gen == st->gen) { /* the slot still holds this prompt: the answer follows it */
        buf_append(&s->held.text, text, len);
        tokenize(&s->held);
    }
    pthread_mutex_unlock(&cache_mu);
    free(text);
}

void prompt_cleanup(void)
{
    for (size_t i = 0; slots && i < g_cfg.slots; i++)
        rendered_free(&slots[i].held);
    free(slots);
    slots = NULL;
    for (size_t i = 0; i < nram; i++)
        rendered_free(&ram[i]);
    free(ram);
    ram = NULL;
    nram = 0;
    for (size_t i = 0; i < OPENAI_KEEP; i++)
        rendered_free(&recent[i]);
    rendered_free(&last_prompt);
    free(aentries);
    aentries = NULL;
    naentries = aentries_cap = 0;
}

/* ------------------------------------------------------------ the window */

void prompt_cut_answer(struct chat_reply *rep, size_t room)
{
    if (rep->ncalls || !rep->content)
        return;
    size_t len = strlen(rep->content);
    if (len / 4 + 1 <= room) /* completion_tokens is the answer's bytes/4 + 1 */
        return;
    size_t keep = room > 1 ? (room - 1) * 4 : 0;
    while (keep > 0 && ((unsigned char)rep->content[keep] & 0xC0) == 0x80)
        keep--; /* never split a UTF-8 sequence */
    rep->content[keep] = '\0';
    rep->finish_reason = "length";
}

void prompt_context_end(const struct prompt_stats *st, struct chat_reply *rep)
{
    if (st->valid && st->window)
        prompt_cut_answer(rep, st->window > st->prompt_tokens ? st->window - st->prompt_tokens : 0);
}

size_t prompt_window(enum dialect d, const json_t *native)
{
    size_t n = g_cfg.n_ctx;
    const json_t *num_ctx = json_object_get(json_object_get(native, "options"), "num_ctx");
    if (d == DIALECT_OLLAMA && json_integer_value(num_ctx) > 0 &&
        (n == 0 || (size_t)json_integer_value(num_ctx) < n))
        n = (size_t)json_integer_value(num_ctx); /* Ollama's window is the request's num_ctx */
    return n;
}

/* The Chat Completions body minus messages [first, first+count), keeping system messages;
 * tool results left without their call go too (Ollama keeps them; a validator would not). */
static json_t *without_messages(const json_t *body, size_t drop)
{
    json_t *out = json_copy((json_t *)body), *msgs = json_array();
    size_t i, dropped = 0;
    json_t *m;
    bool orphan = false;
    json_array_foreach(json_object_get(body, "messages"), i, m) {
        const char *role = chat_role_of(m);
        bool system = role && (strcmp(role, "system") == 0 || strcmp(role, "developer") == 0);
        if (!system && dropped < drop) {
            dropped++;
            orphan = true;
            continue;
        }
        if (orphan && role && strcmp(role, "tool") == 0)
            continue;
        orphan = false;
        json_array_append(msgs, m);
    }
    json_object_set_new(out, "messages", msgs);
    return out;
}

json_t *prompt_ollama_truncate(json_t *body, size_t n_ctx, size_t *dropped)
{
    *dropped = 0;
    size_t droppable = 0, i;
    json_t *m;
    json_array_foreach(json_object_get(body, "messages"), i, m) {
        const char *role = chat_role_of(m);
        droppable += !(role && (strcmp(role, "system") == 0 || strcmp(role, "developer") == 0));
    }
    json_t *cur = json_incref(body);
    /* server/prompt.go chatPrompt: drop the oldest messages until the prompt fits, always
       keeping the system messages and the latest message */
    for (size_t drop = 0; n_ctx && drop + 1 < droppable; drop++) {
        struct rendered r = {0};
        prompt_render_chat(cur, &r);
        size_t n = r.ntok;
        rendered_free(&r);
        if (n <= n_ctx)
            break;
        json_decref(cur);
        cur = without_messages(body, drop + 1);
        *dropped = drop + 1;
    }
    return cur;
}

/* llama.cpp's body (server-task.cpp server_task_result_error::to_json +
 * format_error_response): the sizes as fields beside the message. */
static char *llamacpp_overflow(size_t n, size_t ctx, size_t *len)
{
    char msg[160];
    snprintf(msg, sizeof msg,
             "request (%zu tokens) exceeds the available context size (%zu tokens), try "
             "increasing it", n, ctx);
    json_t *o = json_pack("{s:{s:i,s:s,s:s,s:I,s:I}}", "error", "code", 400, "message", msg,
                          "type", "exceed_context_size_error", "n_prompt_tokens", (json_int_t)n,
                          "n_ctx", (json_int_t)ctx);
    char *s = json_dump_compact(o, len);
    json_decref(o);
    return s;
}

/* vLLM's 400 (vllm/entrypoints/renderer.py, serving_engine.py), {"error":{...}} shape. */
static char *vllm_overflow(size_t n, size_t ctx, long max_tokens, size_t *len)
{
    char msg[320];
    if (n > ctx)
        snprintf(msg, sizeof msg,
                 "This model's maximum context length is %zu tokens. However, your request has "
                 "%zu input tokens. Please reduce the length of the input messages.", ctx, n);
    else
        snprintf(msg, sizeof msg,
                 "'max_tokens' or 'max_completion_tokens' is too large: %ld. This model's maximum "
                 "context length is %zu tokens and your request has %zu input tokens (%ld > %zu - "
                 "%zu).", max_tokens, ctx, n, max_tokens, ctx, n);
    json_t *o = json_pack("{s:{s:s,s:s,s:n,s:i}}", "error", "message", msg, "type",
                          "BadRequestError", "param", "code", 400);
    char *s = json_dump_compact(o, len);
    json_decref(o);
    return s;
}

char *prompt_overflow_body(enum dialect d, size_t n, size_t ctx, long max_tokens, size_t *len)
{
    if (d == DIALECT_OLLAMA || ctx == 0)
        return NULL; /* Ollama truncates instead (prompt_ollama_truncate) */
    bool llamacpp = d == DIALECT_OPENAI && (g_cfg.overflow_style == OVERFLOW_LLAMACPP ||
                                            g_cfg.overflow_style == OVERFLOW_LLAMACPP_OLD);
    /* llama.cpp refuses n_tokens >= n_ctx (a slot needs one free cell to decode) and lets
       max_tokens run into the end of the context; the others count the answer too */
    bool prompt_over = llamacpp ? n >= ctx : n > ctx;
    bool answer_over = !llamacpp && max_tokens > 0 && n + (size_t)max_tokens > ctx;
    if (!prompt_over && !answer_over)
        return NULL;
    struct api_error e = {0};
    if (d == DIALECT_ANTHROPIC) {
        if (prompt_over)
            api_error_set(&e, 400, "invalid_request_error", NULL, NULL,
                          "prompt is too long: %zu tokens > %zu maximum", n, ctx);
        else
            api_error_set(&e, 400, "invalid_request_error", NULL, NULL,
                          "input length and `max_tokens` exceed context limit: %zu + %ld > %zu, "
                          "decrease input length or `max_tokens` and try again", n, max_tokens, ctx);
        char *s = dialect_error_json(d, &e, len);
        api_error_free(&e);
        return s;
    }
    if (llamacpp)
        return llamacpp_overflow(n, ctx, len);
    if (g_cfg.overflow_style == OVERFLOW_VLLM)
        return vllm_overflow(n, ctx, max_tokens, len);
    if (prompt_over) /* OpenAI's context_length_exceeded */
        api_error_set(&e, 400, "invalid_request_error", "messages", "context_length_exceeded",
                      "This model's maximum context length is %zu tokens. However, your messages "
                      "resulted in %zu tokens. Please reduce the length of the messages.", ctx, n);
    else
        api_error_set(&e, 400, "invalid_request_error", "messages", "context_length_exceeded",
                      "This model's maximum context length is %zu tokens. However, you requested "
                      "%zu tokens (%zu in the messages, %ld in the completion). Please reduce the "
                      "length of the messages or completion.", ctx, n + (size_t)max_tokens, n,
                      max_tokens);
    char *s = api_error_json(&e, len);
    api_error_free(&e);
    return s;
}
