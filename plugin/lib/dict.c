/*
 * dict.c -- see dict.h.
 *
 * Open addressing with linear probing over a power-of-two array of entry
 * pointers (0 = empty).  The load factor stays at or below 3/4, so every
 * probe sequence ends at an empty slot.  Deletion shifts the rest of the
 * cluster back instead of leaving tombstones, so lookups never slow down
 * with churn and the table needs no periodic cleanup.
 *
 * Each slot is a 64-bit word.  An entry pointer that fits in 48 bits (every
 * user-space pointer on Linux x86-64 and arm64 without memory tagging) leaves
 * the top 16 bits free, and they hold an 8-bit fingerprint of the key's hash
 * and the entry's distance from its home slot.  A probe then dereferences an
 * entry -- a cache miss in a big table -- only when the fingerprint matches
 * (1 in 256 for a stranger), and deletion shifts entries without rehashing
 * them.  If an entry ever uses those bits the table drops the tags for good
 * and compares keys on every probe: slower, still correct.
 *
 * Keys come from users (conversation ids), so the hash is SipHash-1-3 keyed
 * with a random per-table secret from getrandom(): an attacker who cannot
 * see the secret cannot build colliding keys to flood one probe chain.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "lib/dict.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#define DICT_MIN_CAPACITY 8
#define TAG_SHIFT 48
#define POINTER_BITS ((UINT64_C(1) << TAG_SHIFT) - 1)
#ifndef DICT_DISTANCE_CAP
#define DICT_DISTANCE_CAP 255 /* a stored distance this large means "recompute" */
#endif

struct dict {
    uint64_t *slots;   /* capacity tagged entry pointers, 0 when empty */
    size_t mask;       /* capacity - 1 */
    size_t size;
    dict_key_fn keyof;
    size_t key_len;    /* 0: keys are NUL-terminated strings; else bytes compared */
    uint64_t k0, k1;   /* SipHash secret */
    int tagged;        /* slots carry fingerprint and distance */
};

/* ---- hashing: SipHash-1-3 (one compression round, three finalization rounds) ---- */

static inline uint64_t rotl64(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

#define SIPROUND(v0, v1, v2, v3)                                             \
    do {                                                                     \
        v0 += v1; v1 = rotl64(v1, 13); v1 ^= v0; v0 = rotl64(v0, 32);        \
        v2 += v3; v3 = rotl64(v3, 16); v3 ^= v2;                             \
        v0 += v3; v3 = rotl64(v3, 21); v3 ^= v0;                             \
        v2 += v1; v1 = rotl64(v1, 17); v1 ^= v2; v2 = rotl64(v2, 32);        \
    } while (0)

static inline uint64_t load_le64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static uint64_t siphash13(uint64_t k0, uint64_t k1, const unsigned char *p, size_t n)
{
    uint64_t v0 = k0 ^ 0x736f6d6570736575ULL, v1 = k1 ^ 0x646f72616e646f6dULL;
    uint64_t v2 = k0 ^ 0x6c7967656e657261ULL, v3 = k1 ^ 0x7465646279746573ULL;
    const unsigned char *end = p + (n & ~(size_t)7);
    for (; p != end; p += 8) {
        uint64_t m = load_le64(p);
        v3 ^= m;
        SIPROUND(v0, v1, v2, v3);
        v0 ^= m;
    }
    uint64_t last = (uint64_t)n << 56;
    switch (n & 7) {
    case 7: last |= (uint64_t)p[6] << 48; /* fall through */
    case 6: last |= (uint64_t)p[5] << 40; /* fall through */
    case 5: last |= (uint64_t)p[4] << 32; /* fall through */
    case 4: last |= (uint64_t)p[3] << 24; /* fall through */
    case 3: last |= (uint64_t)p[2] << 16; /* fall through */
    case 2: last |= (uint64_t)p[1] << 8;  /* fall through */
    case 1: last |= (uint64_t)p[0];       /* fall through */
    default: break;
    }
    v3 ^= last;
    SIPROUND(v0, v1, v2, v3);
    v0 ^= last;
    v2 ^= 0xff;
    SIPROUND(v0, v1, v2, v3);
    SIPROUND(v0, v1, v2, v3);
    SIPROUND(v0, v1, v2, v3);
    return v0 ^ v1 ^ v2 ^ v3;
}

static inline uint64_t hash_key(const dict *d, const char *key)
{
    size_t n = d->key_len ? d->key_len : strlen(key);
    return siphash13(d->k0, d->k1, (const unsigned char *)key, n);
}

static inline int key_equal(const dict *d, const char *a, const char *b)
{
    return d->key_len ? memcmp(a, b, d->key_len) == 0 : strcmp(a, b) == 0;
}

/* A secret the caller cannot predict; getrandom() never fails on Linux >= 3.17,
 * but if it does (seccomp, ancient kernel) fall back to clock and address bits,
 * which still defeat precomputed collision sets. */
static void choose_secret(dict *d)
{
    uint64_t k[2];
    if (getrandom(k, sizeof k, GRND_NONBLOCK) != (ssize_t)sizeof k) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t mix = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ULL ^ (uint64_t)ts.tv_sec;
        k[0] = mix ^ (uint64_t)(uintptr_t)d;
        k[1] = rotl64(mix, 29) ^ (uint64_t)(uintptr_t)&k;
    }
    d->k0 = k[0];
    d->k1 = k[1];
}

/* ---- slots ---- */

static size_t capacity(const dict *d) { return d->mask + 1; }

static void *entry_of(const dict *d, uint64_t slot)
{
    return (void *)(uintptr_t)(d->tagged ? slot & POINTER_BITS : slot);
}

static uint64_t distance_bits(size_t distance)
{
    return (uint64_t)(distance < DICT_DISTANCE_CAP ? distance : DICT_DISTANCE_CAP) << TAG_SHIFT;
}

static uint64_t make_slot(const dict *d, void *entry, uint64_t hash, size_t distance)
{
    uint64_t slot = (uint64_t)(uintptr_t)entry;
    return d->tagged ? slot | (hash >> 56) << 56 | distance_bits(distance) : slot;
}

/* The same entry and fingerprint, at a new distance from home. */
static uint64_t moved_slot(const dict *d, uint64_t slot, size_t distance)
{
    const uint64_t distance_mask = UINT64_C(0xff) << TAG_SHIFT;
    return d->tagged ? (slot & ~distance_mask) | distance_bits(distance) : slot;
}

/* Could this slot hold `hash`'s key?  Untagged, only the key can tell. */
static int fingerprint_matches(const dict *d, uint64_t slot, uint64_t hash)
{
    return !d->tagged || slot >> 56 == hash >> 56;
}

static size_t home_of_entry(const dict *d, void *entry)
{
    return (size_t)hash_key(d, d->keyof(entry)) & d->mask;
}

/* How far slot i's entry sits from its home slot. */
static size_t distance_at(const dict *d, size_t i)
{
    if (d->tagged) {
        size_t stored = (size_t)(d->slots[i] >> TAG_SHIFT) & 0xff;
        if (stored < DICT_DISTANCE_CAP)
            return stored;
    }
    return (i - home_of_entry(d, entry_of(d, d->slots[i]))) & d->mask;
}

/* An entry whose pointer needs the tag bits: strip the tags, once and for all. */
static void drop_tags(dict *d)
{
    for (size_t i = 0; i < capacity(d); i++)
        d->slots[i] &= POINTER_BITS; /* 0 stays 0: empty */
    d->tagged = 0;
}

/* ---- table ---- */

/* Place an entry known to be absent; the table must have a free slot. */
static void place(dict *d, void *entry, uint64_t hash)
{
    size_t i = (size_t)hash & d->mask, distance = 0;
    while (d->slots[i]) {
        i = (i + 1) & d->mask;
        distance++;
    }
    d->slots[i] = make_slot(d, entry, hash, distance);
}

/* Rehash into a table of new_capacity slots; -1 (table unchanged) on OOM. */
static int resize(dict *d, size_t new_capacity)
{
    uint64_t *fresh = calloc(new_capacity, sizeof *fresh);
    if (!fresh)
        return -1;
    uint64_t *old = d->slots;
    size_t old_capacity = capacity(d);
    d->slots = fresh;
    d->mask = new_capacity - 1;
    for (size_t i = 0; i < old_capacity; i++) {
        if (old[i]) {
            void *entry = entry_of(d, old[i]);
            place(d, entry, hash_key(d, d->keyof(entry)));
        }
    }
    free(old);
    return 0;
}

dict *dict_new(dict_key_fn keyof)
{
    return dict_new_fixed(keyof, 0);
}

dict *dict_new_fixed(dict_key_fn keyof, size_t key_len)
{
    dict *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->slots = calloc(DICT_MIN_CAPACITY, sizeof *d->slots);
    if (!d->slots) {
        free(d);
        return NULL;
    }
    d->mask = DICT_MIN_CAPACITY - 1;
    d->keyof = keyof;
    d->key_len = key_len;
    d->tagged = 1;
    choose_secret(d);
    return d;
}

void dict_free(dict *d)
{
    if (!d)
        return;
    free(d->slots);
    free(d);
}

/* Index of the slot holding `key`, or of the empty slot ending its probe run. */
static size_t probe(const dict *d, const char *key)
{
    uint64_t hash = hash_key(d, key);
    size_t i = (size_t)hash & d->mask;
    for (;; i = (i + 1) & d->mask) {
        uint64_t slot = d->slots[i];
        if (!slot)
            return i;
        if (fingerprint_matches(d, slot, hash) && key_equal(d, d->keyof(entry_of(d, slot)), key))
            return i;
    }
}

void *dict_find(const dict *d, const char *key)
{
    return entry_of(d, d->slots[probe(d, key)]);
}

int dict_add(dict *d, void *entry)
{
    if (!entry)
        return -1;
    /* Keep size/capacity <= 3/4: short probe runs, and always an empty slot. */
    if ((d->size + 1) * 4 > capacity(d) * 3) {
        if (capacity(d) > SIZE_MAX / 2 / sizeof *d->slots || resize(d, capacity(d) * 2) != 0)
            return -1;
    }
    if (d->tagged && ((uint64_t)(uintptr_t)entry & ~POINTER_BITS))
        drop_tags(d);
    place(d, entry, hash_key(d, d->keyof(entry)));
    d->size++;
    return 0;
}

/*
 * Backward-shift deletion: walk the cluster after the hole and move back
 * every entry whose probe run passes through the hole, so that no entry is
 * ever separated from its home slot by an empty slot.
 */
static void close_hole(dict *d, size_t hole)
{
    for (size_t j = (hole + 1) & d->mask; d->slots[j]; j = (j + 1) & d->mask) {
        size_t distance = distance_at(d, j), gap = (j - hole) & d->mask;
        /* The hole lies on j's probe run iff it is no farther back than home. */
        if (distance >= gap) {
            d->slots[hole] = moved_slot(d, d->slots[j], distance - gap);
            hole = j;
        }
    }
    d->slots[hole] = 0;
}

/* Give memory back after mass removal (expiry, clear); best effort, halving
 * leaves the load at <= 1/4, far from the 3/4 that triggers growth. */
static void maybe_shrink(dict *d)
{
    if (capacity(d) > DICT_MIN_CAPACITY && d->size < capacity(d) / 8)
        (void)resize(d, capacity(d) / 2);
}

void *dict_remove(dict *d, const char *key)
{
    size_t i = probe(d, key);
    if (!d->slots[i])
        return NULL;
    void *entry = entry_of(d, d->slots[i]);
    close_hole(d, i);
    d->size--;
    maybe_shrink(d);
    return entry;
}

void *dict_replace(dict *d, void *entry)
{
    if (!entry)
        return NULL;
    size_t i = probe(d, d->keyof(entry));
    if (!d->slots[i])
        return NULL;
    void *old = entry_of(d, d->slots[i]);
    uint64_t pointer = (uint64_t)(uintptr_t)entry;
    if (d->tagged && (pointer & ~POINTER_BITS))
        drop_tags(d); /* slots keep their places: i still holds the key */
    /* Same key: same fingerprint and distance; only the pointer changes. */
    d->slots[i] = d->tagged ? (d->slots[i] & ~POINTER_BITS) | pointer : pointer;
    return old;
}

size_t dict_size(const dict *d) { return d->size; }

void dict_foreach(const dict *d, void (*fn)(void *entry, void *ud), void *ud)
{
    for (size_t i = 0; i < capacity(d); i++)
        if (d->slots[i])
            fn(entry_of(d, d->slots[i]), ud);
}
