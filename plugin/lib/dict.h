/*
 * dict.h -- an intrusive, string-keyed hash table (open addressing, linear
 * probing, power-of-two sizes, incremental-free growth by rehash).
 *
 * "Intrusive": the table stores only pointers to the caller's entries and
 * reads each entry's key through `keyof`, so a key is never copied and an
 * entry costs one pointer slot (~16 bytes at the maximum load factor).
 * Not thread-safe: the owner locks.
 */
#ifndef PARLEY_DICT_H
#define PARLEY_DICT_H

#include <stddef.h>

typedef struct dict dict;
typedef const char *(*dict_key_fn)(const void *entry);

dict *dict_new(dict_key_fn keyof);            /* NULL on OOM */
/* Keys of exactly key_len bytes (may hold NUL: a binary id), compared with
 * memcmp; the char * of keyof and the functions below point at those bytes. */
dict *dict_new_fixed(dict_key_fn keyof, size_t key_len);
void dict_free(dict *d);                       /* frees the table, not the entries */
void *dict_find(const dict *d, const char *key);
int dict_add(dict *d, void *entry);            /* key must not be present; 0, or -1 on OOM */
void *dict_remove(dict *d, const char *key);   /* the removed entry, or NULL */
/* Put `entry` where the entry with its key is: the old entry, or NULL (then
 * nothing changed).  Never allocates, so never fails. */
void *dict_replace(dict *d, void *entry);
size_t dict_size(const dict *d);
/* Call fn for every entry; fn must not add or remove. */
void dict_foreach(const dict *d, void (*fn)(void *entry, void *ud), void *ud);

#endif
