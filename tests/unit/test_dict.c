/* test_dict.c -- dict.c against a trivially correct reference (a presence array). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "lib/dict.h"

typedef struct item {
    char key[48];
    int visits;
} item;

static const char *item_key(const void *entry) { return ((const item *)entry)->key; }

/*
 * The dict never touches an entry except through keyof, so an "entry" may be
 * any non-NULL value.  Entries with the top 16 bits set (as arm64 tagged heap
 * pointers would be) stand for items[index] and must switch the table to
 * untagged slots without losing anything.
 */
#define FAKE_BITS (UINT64_C(0xA5C3) << 48)
static item *fake_items;

static int is_fake(const void *entry) { return ((uint64_t)(uintptr_t)entry & FAKE_BITS) != 0; }

static const char *mixed_key(const void *entry)
{
    if (is_fake(entry))
        return fake_items[(uint64_t)(uintptr_t)entry & 0xffffffu].key;
    return item_key(entry);
}

/* Key k's entry: the item itself, or (every fake_every-th key) a fake pointer. */
static void *entry_for(item *items, size_t k, size_t fake_every)
{
    if (fake_every && UINTPTR_MAX > 0xffffffffu && k % fake_every == 0)
        return (void *)(uintptr_t)(FAKE_BITS | k);
    return &items[k];
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static item *make_items(size_t n)
{
    item *items = calloc(n, sizeof *items);
    for (size_t i = 0; i < n; i++)
        snprintf(items[i].key, sizeof items[i].key, "conv-%zu", i);
    return items;
}

/* Every key is found iff the reference says present, and the size agrees. */
static int matches_reference(const dict *d, item *items, const char *present, size_t n,
                             size_t fake_every)
{
    size_t count = 0;
    for (size_t i = 0; i < n; i++) {
        void *found = dict_find(d, items[i].key);
        if (found != (present[i] ? entry_for(items, i, fake_every) : NULL))
            return 0;
        count += present[i] != 0;
    }
    return dict_size(d) == count;
}

static void test_empty(void)
{
    dict *d = dict_new(item_key);
    CHECK(d != NULL);
    CHECK(dict_size(d) == 0);
    CHECK(dict_find(d, "nope") == NULL);
    CHECK(dict_remove(d, "nope") == NULL);
    CHECK(dict_find(d, "") == NULL);
    CHECK(dict_add(d, NULL) == -1);
    dict_free(d);
    dict_free(NULL); /* allowed, like free() */
}

static void test_basic(void)
{
    item *items = make_items(3);
    dict *d = dict_new(item_key);
    for (int i = 0; i < 3; i++)
        CHECK(dict_add(d, &items[i]) == 0);
    CHECK(dict_size(d) == 3);
    CHECK(dict_find(d, "conv-0") == &items[0]);
    CHECK(dict_find(d, "conv-1") == &items[1]);
    CHECK(dict_find(d, "conv-2") == &items[2]);
    CHECK(dict_find(d, "conv-3") == NULL);
    CHECK(dict_find(d, "conv-") == NULL); /* a prefix is not a match */
    CHECK(dict_remove(d, "conv-1") == &items[1]);
    CHECK(dict_remove(d, "conv-1") == NULL);
    CHECK(dict_size(d) == 2);
    CHECK(dict_find(d, "conv-0") == &items[0]);
    CHECK(dict_find(d, "conv-1") == NULL);
    CHECK(dict_find(d, "conv-2") == &items[2]);
    dict_free(d);
    free(items);
}

/* dict_replace swaps the entry of a key in place, among many (long probe
 * runs), and leaves every other key where it was; an absent key changes nothing. */
static void test_replace(void)
{
    enum { N = 1000 };
    item *items = make_items(N), *twins = make_items(N);
    dict *d = dict_new(item_key);
    for (int i = 0; i < N; i++)
        CHECK(dict_add(d, &items[i]) == 0);
    for (int i = 0; i < N; i += 3)
        CHECK(dict_replace(d, &twins[i]) == &items[i]);
    int ok = 1;
    for (int i = 0; i < N; i++)
        ok &= dict_find(d, items[i].key) == (i % 3 ? &items[i] : &twins[i]);
    CHECK(ok);
    CHECK(dict_size(d) == N);
    item stranger = {"not-there", 0};
    CHECK(dict_replace(d, &stranger) == NULL);
    CHECK(dict_find(d, "not-there") == NULL && dict_size(d) == N);
    CHECK(dict_replace(d, NULL) == NULL);
    /* A tagged-pointer entry switches the table to plain slots, keeping all. */
    if (UINTPTR_MAX > 0xffffffffu) {
        fake_items = twins;
        dict *m = dict_new(mixed_key);
        for (int i = 0; i < N; i++)
            CHECK(dict_add(m, &items[i]) == 0);
        CHECK(dict_replace(m, (void *)(uintptr_t)(FAKE_BITS | 7)) == &items[7]);
        ok = 1;
        for (int i = 0; i < N; i++)
            ok &= dict_find(m, items[i].key) ==
                  (i == 7 ? (void *)(uintptr_t)(FAKE_BITS | 7) : (void *)&items[i]);
        CHECK(ok);
        dict_free(m);
    }
    dict_free(d);
    free(items);
    free(twins);
}

/* Keys of every length 0..47 around the hash's 8-byte blocks, and keys that
 * differ only in their last byte. */
static void test_key_shapes(void)
{
    enum { N = 48 };
    item *items = calloc(2 * N, sizeof *items);
    dict *d = dict_new(item_key);
    for (int len = 0; len < N; len++) {
        memset(items[len].key, 'a', (size_t)len);
        memset(items[N + len].key, 'a', (size_t)len);
        if (len > 0)
            items[N + len].key[len - 1] = 'b';
        CHECK(dict_add(d, &items[len]) == 0);
        if (len > 0)
            CHECK(dict_add(d, &items[N + len]) == 0);
    }
    CHECK(dict_size(d) == 2 * N - 1);
    int all_found = 1;
    for (int len = 0; len < N; len++) {
        all_found &= dict_find(d, items[len].key) == &items[len];
        if (len > 0)
            all_found &= dict_find(d, items[N + len].key) == &items[N + len];
    }
    CHECK(all_found);
    CHECK(dict_find(d, "") == &items[0]);
    dict_free(d);
    free(items);
}

/*
 * Random add/remove/find against the reference.  A small key space keeps the
 * table small and nearly full, so probe runs collide, cluster and wrap past
 * the end of the array -- the cases backward-shift deletion must get right.
 * With fake_every, some entries are fake high-bit pointers (see entry_for).
 */
static void churn_with(size_t nkeys, size_t nops, size_t fake_every)
{
    item *items = make_items(nkeys);
    fake_items = items;
    char *present = calloc(nkeys, 1);
    dict *d = dict_new(mixed_key);
    size_t mismatches = 0, count = 0;
    for (size_t op = 0; op < nops; op++) {
        size_t k = (size_t)(rng() % nkeys);
        void *entry = entry_for(items, k, fake_every);
        if (present[k]) {
            if (rng() % 3 == 0) {
                mismatches += dict_find(d, items[k].key) != entry;
            } else {
                mismatches += dict_remove(d, items[k].key) != entry;
                present[k] = 0;
                count--;
            }
        } else {
            mismatches += dict_find(d, items[k].key) != NULL;
            mismatches += dict_remove(d, items[k].key) != NULL;
            mismatches += dict_add(d, entry) != 0;
            present[k] = 1;
            count++;
        }
        mismatches += dict_size(d) != count;
        if (op % (nops / 20) == 0)
            mismatches += !matches_reference(d, items, present, nkeys, fake_every);
    }
    CHECK(mismatches == 0);
    CHECK(matches_reference(d, items, present, nkeys, fake_every));
    dict_free(d);
    free(present);
    free(items);
}

static void churn(size_t nkeys, size_t nops) { churn_with(nkeys, nops, 0); }

/* Grow to many entries, then remove all in random order (shrinking on the way). */
/* Fixed-length binary keys: bytes after a NUL still count, bytes past
 * key_len do not, and the table grows and shrinks like a string-keyed one. */
static void test_fixed_keys(void)
{
    enum { N = 2000, LEN = 16 };
    item *items = calloc(N, sizeof *items);
    dict *d = dict_new_fixed(item_key, LEN);
    CHECK(items && d);
    for (int i = 0; i < N; i++) { /* keys differ only after a leading NUL */
        items[i].key[0] = '\0';
        memcpy(items[i].key + LEN - sizeof i, &i, sizeof i);
        items[i].key[LEN] = (char)(i % 7); /* past the key: ignored */
        CHECK(dict_add(d, &items[i]) == 0);
    }
    CHECK(dict_size(d) == N);
    int ok = 1;
    for (int i = 0; i < N; i++) {
        char probe[LEN + 1] = {0};
        memcpy(probe + LEN - sizeof i, &i, sizeof i);
        probe[LEN] = 'x';
        ok &= dict_find(d, probe) == &items[i];
    }
    CHECK(ok);
    char absent[LEN] = {0};
    absent[1] = 1;
    CHECK(dict_find(d, absent) == NULL);
    for (int i = 0; i < N; i += 2)
        CHECK(dict_remove(d, items[i].key) == &items[i]);
    ok = dict_size(d) == N / 2;
    for (int i = 0; i < N; i++)
        ok &= dict_find(d, items[i].key) == (i % 2 ? &items[i] : NULL);
    CHECK(ok);
    dict_free(d);
    free(items);
}

static void test_grow_and_drain(size_t n)
{
    item *items = make_items(n);
    char *present = calloc(n, 1);
    size_t *order = malloc(n * sizeof *order);
    dict *d = dict_new(item_key);
    int add_failed = 0;
    for (size_t i = 0; i < n; i++) {
        add_failed |= dict_add(d, &items[i]) != 0;
        present[i] = 1;
        order[i] = i;
    }
    CHECK(!add_failed);
    CHECK(dict_size(d) == n);
    CHECK(matches_reference(d, items, present, n, 0));
    for (size_t i = n - 1; i > 0; i--) { /* Fisher-Yates */
        size_t j = (size_t)(rng() % (i + 1)), tmp = order[i];
        order[i] = order[j];
        order[j] = tmp;
    }
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++) {
        wrong += dict_remove(d, items[order[i]].key) != &items[order[i]];
        present[order[i]] = 0;
        if (i == n / 2 || i == n - n / 16) /* spot checks across shrink steps */
            CHECK(matches_reference(d, items, present, n, 0));
    }
    CHECK(wrong == 0);
    CHECK(dict_size(d) == 0);
    CHECK(dict_add(d, &items[7]) == 0); /* still usable after shrinking */
    CHECK(dict_find(d, items[7].key) == &items[7]);
    dict_free(d);
    free(order);
    free(present);
    free(items);
}

static void count_visit(void *entry, void *ud)
{
    ((item *)entry)->visits++;
    (*(size_t *)ud)++;
}

static void test_foreach(void)
{
    enum { N = 1000 };
    item *items = make_items(N);
    dict *d = dict_new(item_key);
    for (int i = 0; i < N; i++)
        dict_add(d, &items[i]);
    for (int i = 0; i < N; i += 2)
        dict_remove(d, items[i].key);
    size_t calls = 0;
    dict_foreach(d, count_visit, &calls);
    CHECK(calls == N / 2);
    int exactly_once = 1;
    for (int i = 0; i < N; i++)
        exactly_once &= items[i].visits == (i % 2 ? 1 : 0);
    CHECK(exactly_once);
    dict_free(d);
    free(items);
}

typedef struct order_log {
    const item *seen[64];
    size_t n;
} order_log;

static void log_order(void *entry, void *ud)
{
    order_log *log = ud;
    if (log->n < 64)
        log->seen[log->n++] = entry;
}

/* Each table hashes with its own secret, so the same keys land in a different
 * order: colliding keys cannot be precomputed by whoever picks the ids. */
static void test_tables_are_seeded(void)
{
    enum { N = 40 };
    item *items = make_items(N);
    dict *a = dict_new(item_key), *b = dict_new(item_key);
    for (int i = 0; i < N; i++) {
        dict_add(a, &items[i]);
        dict_add(b, &items[i]);
    }
    order_log la = {{0}, 0}, lb = {{0}, 0};
    dict_foreach(a, log_order, &la);
    dict_foreach(b, log_order, &lb);
    CHECK(la.n == N && lb.n == N);
    CHECK(memcmp(la.seen, lb.seen, sizeof la.seen) != 0);
    dict_free(a);
    dict_free(b);
    free(items);
}

int main(void)
{
    test_empty();
    test_basic();
    test_replace();
    test_key_shapes();
    test_fixed_keys();
    churn(6, 20000);       /* capacity 8 at the 3/4 maximum load */
    churn(13, 50000);      /* capacity 16/32: long clusters, wrap-around */
    churn(100, 100000);
    churn(20000, 400000);  /* repeated grow/shrink under churn */
    churn_with(13, 50000, 5);       /* tags dropped midway: plain pointers */
    churn_with(20000, 200000, 1000);
    test_grow_and_drain(300000);
    test_foreach();
    test_tables_are_seeded();
    return check_report();
}
