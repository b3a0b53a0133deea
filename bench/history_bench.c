/*
 * history_bench.c -- memory and speed of the conversation store at scale.
 *
 *   history_bench [conversations=100000] [ops=100000] [identity=0]
 *
 * Fills `conversations` conversations with 5 turns each (a user message of
 * ~40 bytes of text and an assistant answer of ~80, as OpenAI message JSON;
 * turns interleaved across conversations, as real traffic is), then reports
 * the stored message bytes, the RSS growth and its ratio to them, and the
 * cost of a load / an append at that size, measured over `ops`
 * random operations (median and minimum of 5 batches).  One "name value"
 * line per metric.  identity=1: every message also carries what a chat
 * interface gives it (store.h version 4): an interface message id on both,
 * and on the user's message ~40 bytes of metadata.
 *
 * The store is the memory backend (plugin/store/memory.c), called through its
 * store_backend table as the agent calls it.
 */
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "store/store.h"

#define TURNS_PER_CONVERSATION 5
#define ID_SIZE 27    /* 26-char ULID, as Home Assistant mints them */
#define TURN_ID_SIZE 37

/* ---- deterministic pseudo-random data ---- */

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static uint64_t rng_state = 42;
static uint64_t rng(void) { return splitmix64(rng_state++); }

/* Conversation i's id, recomputed on demand so the bench stores no ids. */
static void conversation_id(uint64_t i, char out[ID_SIZE])
{
    static const char crockford[] = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    uint64_t stamp = 0x0192a3b4c5d6ULL + i / 1000;
    uint64_t lo = splitmix64(i), hi = splitmix64(i ^ 0x5bd1e995ULL);
    for (int k = 0; k < 10; k++, stamp >>= 5) /* 48-bit timestamp part */
        out[9 - k] = crockford[stamp & 31];
    /* 80 random bits; all 64 of splitmix64(i), a bijection, so ids never collide */
    for (int k = 0; k < 12; k++, lo >>= 5)
        out[10 + k] = crockford[lo & 31];
    out[22] = crockford[(lo & 15) | (hi & 16)];
    for (int k = 0; k < 3; k++, hi >>= 5)
        out[23 + k] = crockford[hi & 31];
    out[26] = '\0';
}

static void turn_id(uint64_t n, char out[TURN_ID_SIZE])
{
    uint64_t a = splitmix64(n), b = splitmix64(~n);
    snprintf(out, TURN_ID_SIZE, "%08x-%04x-4%03x-%04x-%012llx", (unsigned)(a >> 32),
             (unsigned)(a >> 16) & 0xffff, (unsigned)a & 0xfff,
             0x8000u | ((unsigned)(b >> 48) & 0x3fff), (unsigned long long)(b & 0xffffffffffffULL));
}

static const char *const words[] = {
    "turn", "on", "off", "the", "kitchen", "lights", "please", "set", "living", "room",
    "to", "percent", "what", "is", "temperature", "outside", "lock", "front", "door", "and",
    "bedroom", "heating", "degrees", "timer", "for", "minutes", "open", "garage", "blinds", "now",
};

/* About `target` bytes of plain words. */
static size_t sentence(char *out, size_t target)
{
    size_t len = 0;
    while (len < target) {
        const char *w = words[rng() % (sizeof words / sizeof *words)];
        size_t n = strlen(w);
        if (len)
            out[len++] = ' ';
        memcpy(out + len, w, n);
        len += n;
    }
    out[len] = '\0';
    return len;
}

/* One turn's messages: user ~40 bytes of text, assistant ~80. */
static size_t turn_messages(char *out, size_t cap)
{
    char user[128], assistant[160];
    sentence(user, 34 + rng() % 12);
    sentence(assistant, 70 + rng() % 20);
    return (size_t)snprintf(out, cap,
                            "{\"role\":\"user\",\"content\":\"%s\"},"
                            "{\"role\":\"assistant\",\"content\":\"%s\"}",
                            user, assistant);
}

/* ---- measuring ---- */

static long rss_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb * 1024;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t clock_ms = 1795375860000ULL; /* advances 1 ms per commit */

static const store_backend *const B = &store_memory_backend;
static int with_identity; /* the third argument */

/* Append the turn "user,assistant" (as turn_messages writes it) to conversation id. */
static int append_joined(store *h, const char *id, const char *tid, const char *text, size_t len)
{
    size_t user_len = (size_t)(strstr(text, "},{") - text) + 1;
    store_message m[2] = {
        {"00000000-0000-4000-8000-000000000001", "user", clock_ms - 900, text, user_len, NULL, NULL, 0},
        {"00000000-0000-4000-8000-000000000002", "assistant", clock_ms, text + user_len + 1,
         len - user_len - 1, NULL, NULL, 0},
    };
    char user_id[24], answer_id[24];
    if (with_identity) { /* Telegram-sized ids: a chat's message counter */
        snprintf(user_id, sizeof user_id, "%llu", (unsigned long long)(clock_ms % 100000000));
        snprintf(answer_id, sizeof answer_id, "%llu",
                 (unsigned long long)(clock_ms % 100000000 + 1));
        m[0].interface_message_id = user_id;
        m[0].metadata = "{\"chat_id\":123456789,\"from\":\"alice\"}";
        m[0].metadata_len = strlen(m[0].metadata);
        m[1].interface_message_id = answer_id;
    }
    /* its size in tokens as the plugin stores it (the bytes / 4: ctx_turn_tokens) */
    uint32_t tokens = (uint32_t)((m[0].json_len + m[1].json_len + 2) / 4 + 1);
    store_turn in = {tid, clock_ms - 900, clock_ms, m, 2, NULL, 0, tokens};
    store_key key = {id, "", ""};
    return B->append(h, &key, &in, clock_ms++, NULL) == PARLEY_OK ? 0 : -1;
}

static int commit(store *h, const char *id, uint64_t turn_no)
{
    char tid[TURN_ID_SIZE], messages[512];
    turn_id(turn_no, tid);
    size_t len = turn_messages(messages, sizeof messages);
    return append_joined(h, id, tid, messages, len);
}

/* ---- phases ---- */

static void fill(store *h, uint64_t conversations)
{
    char id[ID_SIZE];
    uint64_t turn_no = 0;
    for (int round = 0; round < TURNS_PER_CONVERSATION; round++)
        for (uint64_t i = 0; i < conversations; i++) {
            conversation_id(i, id);
            if (commit(h, id, turn_no++) != 0) {
                fprintf(stderr, "commit failed (out of memory?)\n");
                exit(1);
            }
        }
}

/* `ops` conversation ids: existing ones chosen at random, or new ones. */
static char *pick_ids(uint64_t ops, uint64_t conversations, int fresh)
{
    char *ids = malloc(ops * ID_SIZE);
    if (!ids)
        exit(1);
    for (uint64_t k = 0; k < ops; k++)
        conversation_id(fresh ? conversations + k : rng() % conversations, ids + k * ID_SIZE);
    return ids;
}

/*
 * The ops run in BATCHES equal batches, each timed on its own: on a shared
 * machine the median (and the minimum, the least disturbed) per-op time is
 * steadier than one mean over everything.
 */
#define BATCHES 5

typedef struct timing {
    double median_ns, min_ns;
} timing;

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static timing summarize(double ns[BATCHES])
{
    qsort(ns, BATCHES, sizeof *ns, by_value);
    return (timing){ns[BATCHES / 2], ns[0]};
}

/* Render ops/BATCHES random conversations per batch; *messages counts all. */
static timing time_renders(store *h, const char *ids, uint64_t ops, size_t *messages)
{
    pbuf out = PBUF_INIT;
    double ns[BATCHES];
    uint64_t per_batch = ops / BATCHES;
    *messages = 0;
    for (uint64_t b = 0; b < BATCHES; b++) {
        double t0 = now_s();
        for (uint64_t k = b * per_batch; k < (b + 1) * per_batch; k++) {
            pbuf_reset(&out);
            store_key key = {ids + k * ID_SIZE, "", ""};
            size_t n = 0;
            B->load(h, &key, 0, clock_ms, &out, &n, NULL);
            *messages += n;
        }
        ns[b] = (now_s() - t0) * 1e9 / (double)per_batch;
    }
    pbuf_free(&out);
    return summarize(ns);
}

/* Prepared commit inputs, so the timed loop runs the append alone. */
#define TEXT_POOL 1024

typedef struct commit_inputs {
    char *turn_ids;                /* ops ids, TURN_ID_SIZE each */
    char texts[TEXT_POOL][512];    /* reused round-robin */
    size_t lengths[TEXT_POOL];
} commit_inputs;

static commit_inputs *prepare_commits(uint64_t ops, uint64_t first_turn)
{
    commit_inputs *in = malloc(sizeof *in);
    if (!in || !(in->turn_ids = malloc(ops * TURN_ID_SIZE)))
        exit(1);
    for (uint64_t k = 0; k < ops; k++)
        turn_id(first_turn + k, in->turn_ids + k * TURN_ID_SIZE);
    for (int i = 0; i < TEXT_POOL; i++)
        in->lengths[i] = turn_messages(in->texts[i], sizeof in->texts[i]);
    return in;
}

static void free_commits(commit_inputs *in)
{
    free(in->turn_ids);
    free(in);
}

static timing time_commits(store *h, const char *ids, uint64_t ops, uint64_t first_turn)
{
    commit_inputs *in = prepare_commits(ops, first_turn);
    double ns[BATCHES];
    uint64_t per_batch = ops / BATCHES;
    for (uint64_t b = 0; b < BATCHES; b++) {
        double t0 = now_s();
        for (uint64_t k = b * per_batch; k < (b + 1) * per_batch; k++) {
            if (append_joined(h, ids + k * ID_SIZE, in->turn_ids + k * TURN_ID_SIZE,
                              in->texts[k % TEXT_POOL], in->lengths[k % TEXT_POOL]) != 0)
                exit(1);
        }
        ns[b] = (now_s() - t0) * 1e9 / (double)per_batch;
    }
    free_commits(in);
    return summarize(ns);
}

int main(int argc, char **argv)
{
    uint64_t conversations = argc > 1 ? strtoull(argv[1], NULL, 10) : 100000;
    uint64_t ops = argc > 2 ? strtoull(argv[2], NULL, 10) : 100000;
    with_identity = argc > 3 && strcmp(argv[3], "1") == 0;
    if (conversations == 0 || ops < BATCHES || (argc > 3 && !with_identity && strcmp(argv[3], "0"))) {
        fprintf(stderr, "usage: %s [conversations >= 1] [ops >= %d] [identity 0|1]\n", argv[0],
                BATCHES);
        return 2;
    }
    ops -= ops % BATCHES;
    store_config cfg = {.location = "",
                        .limits = {TURNS_PER_CONVERSATION, (size_t)conversations, 0}};

    long rss_before = rss_bytes();
    store *h = NULL;
    if (B->open(&cfg, &h, NULL) != PARLEY_OK)
        return 1;
    double t0 = now_s();
    fill(h, conversations);
    double fill_s = now_s() - t0;
    long rss_after = rss_bytes();
    struct mallinfo2 mi = mallinfo2();

    store_stats s;
    B->stats(h, &s, NULL);
    double growth = (double)(rss_after - rss_before);
    printf("conversations               %zu\n", s.conversations);
    printf("turns                       %zu\n", s.turns);
    printf("stored_message_bytes        %zu\n", s.message_bytes);
    printf("rss_growth_bytes            %ld\n", rss_after - rss_before);
    printf("rss_growth_per_stored_byte  %.2f\n", growth / (double)s.message_bytes);
    printf("stored_bytes_per_conv       %.0f\n", (double)s.message_bytes / (double)conversations);
    printf("rss_bytes_per_conv          %.0f\n", growth / (double)conversations);
    printf("malloc_in_use_bytes         %zu\n", mi.uordblks + mi.hblkhd);
    printf("fill_s                      %.2f\n", fill_s);

    size_t rendered = 0;
    char *ids = pick_ids(ops, conversations, 0);
    timing t = time_renders(h, ids, ops, &rendered);
    printf("render_ns_per_op            %.0f  (min %.0f; %.1f messages each)\n", t.median_ns,
           t.min_ns, (double)rendered / (double)ops);
    t = time_commits(h, ids, ops, 1ULL << 40);
    printf("commit_ns_per_op            %.0f  (min %.0f; existing conversation, drops its oldest "
           "turn)\n", t.median_ns, t.min_ns);
    free(ids);
    ids = pick_ids(ops, conversations, 1);
    t = time_commits(h, ids, ops, 1ULL << 41);
    printf("commit_new_ns_per_op        %.0f  (min %.0f; new conversation, evicts the LRU one)\n",
           t.median_ns, t.min_ns);
    free(ids);

    B->stats(h, &s, NULL);
    printf("evicted                     %zu\n", s.evicted);
    B->close(h);
    return 0;
}
