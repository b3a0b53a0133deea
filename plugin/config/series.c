/* series.c -- see series.h. */
#include "config/series.h"

#include <stdlib.h>
#include <string.h>

/* One remembered conversation: key = conversation id, '\x1f', interface (ids hold no
 * control characters, so the key is unambiguous). */
typedef struct last_entry {
    char *key;
    char *persona;
} last_entry;

static const char *last_key(const void *e) { return ((const last_entry *)e)->key; }

static void free_last(void *e, void *ud)
{
    (void)ud;
    last_entry *l = e;
    free(l->key);
    free(l->persona);
    free(l);
}

void series_init(series_metrics *m)
{
    pthread_mutex_init(&m->lock, NULL);
    m->head = NULL;
    m->switches = NULL;
    m->last_persona = dict_new(last_key); /* NULL (no memory): switches go uncounted */
    atomic_init(&m->host_clears, 0);
}

void series_destroy(series_metrics *m)
{
    for (series_counters *c = m->head, *next; c; c = next) {
        next = c->next;
        free(c->persona);
        free(c->interface_type);
        free(c);
    }
    for (persona_switch *s = m->switches, *next; s; s = next) {
        next = s->next;
        free(s->from);
        free(s->to);
        free(s);
    }
    if (m->last_persona) {
        dict_foreach(m->last_persona, free_last, NULL);
        dict_free(m->last_persona);
    }
    m->head = NULL;
    m->switches = NULL;
    m->last_persona = NULL;
    pthread_mutex_destroy(&m->lock);
}

series_counters *series_for(series_metrics *m, const char *persona, const char *interface_type)
{
    persona = persona ? persona : "";
    interface_type = interface_type ? interface_type : "";
    pthread_mutex_lock(&m->lock);
    series_counters *c = m->head;
    while (c &&
           (strcmp(c->persona, persona) != 0 || strcmp(c->interface_type, interface_type) != 0))
        c = c->next;
    if (!c && (c = calloc(1, sizeof *c)) != NULL) {
        c->persona = strdup(persona);
        c->interface_type = strdup(interface_type);
        if (c->persona && c->interface_type) {
            c->next = m->head;
            m->head = c;
        } else {
            free(c->persona);
            free(c->interface_type);
            free(c);
            c = NULL;
        }
    }
    pthread_mutex_unlock(&m->lock);
    return c;
}

/* Count one switch from -> to (lock held). */
static void count_switch(series_metrics *m, const char *from, const char *to)
{
    persona_switch *s = m->switches;
    while (s && (strcmp(s->from, from) != 0 || strcmp(s->to, to) != 0))
        s = s->next;
    if (!s && (s = calloc(1, sizeof *s)) != NULL) {
        s->from = strdup(from);
        s->to = strdup(to);
        if (!s->from || !s->to) {
            free(s->from);
            free(s->to);
            free(s);
            return;
        }
        s->next = m->switches;
        m->switches = s;
    }
    if (s)
        atomic_fetch_add(&s->count, 1);
}

/* Remember `persona` as the last of `key` (lock held), counting a switch when it differs. */
static void remember(series_metrics *m, const char *key, const char *persona)
{
    last_entry *e = dict_find(m->last_persona, key);
    if (e && strcmp(e->persona, persona) == 0)
        return; /* the same persona again: the common case, nothing to copy */
    char *p = strdup(persona);
    if (!p)
        return;
    if (e) {
        count_switch(m, e->persona, persona);
        free(e->persona);
        e->persona = p;
        return;
    }
    if (dict_size(m->last_persona) >= SERIES_MAX_TRACKED) { /* bounded: start over */
        dict_foreach(m->last_persona, free_last, NULL);
        dict_free(m->last_persona);
        if (!(m->last_persona = dict_new(last_key))) {
            free(p);
            return;
        }
    }
    e = calloc(1, sizeof *e);
    if (!e || !(e->key = strdup(key)) || dict_add(m->last_persona, e) != 0) {
        if (e)
            free(e->key);
        free(e);
        free(p);
        return;
    }
    e->persona = p;
}

void series_turn_begins(series_metrics *m, const char *conversation_id, const char *interface_type,
                        const char *persona)
{
    if (!conversation_id)
        return; /* stateless: no conversation to switch in */
    char *key = pstr_printf("%s\x1f%s", conversation_id, interface_type ? interface_type : "");
    if (!key)
        return;
    pthread_mutex_lock(&m->lock);
    if (m->last_persona)
        remember(m, key, persona ? persona : "");
    pthread_mutex_unlock(&m->lock);
    free(key);
}

void series_each(series_metrics *m, void (*fn)(const series_counters *c, void *ud),
                 void (*sw)(const persona_switch *s, void *ud), void *ud)
{
    pthread_mutex_lock(&m->lock);
    for (const series_counters *c = m->head; fn && c; c = c->next)
        fn(c, ud);
    for (const persona_switch *s = m->switches; sw && s; s = s->next)
        sw(s, ud);
    pthread_mutex_unlock(&m->lock);
}
