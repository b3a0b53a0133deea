/*
 * options_ui.h -- how a settings form presents each option: a title, a group
 * (basic / advanced) and widget hints (secret, URL, item schema).
 *
 * Kept apart from the SPECS table of options.c (what an option IS: type,
 * range, default) so the two can grow independently; options_schema() joins
 * them by option name.  Every option needs a row here: test_options fails
 * for one without a title or group.
 */
#ifndef PARLEY_OPTIONS_UI_H
#define PARLEY_OPTIONS_UI_H

enum {
    OPTION_UI_SECRET = 1u << 0, /* writeOnly, "format": "password": a form never shows it back */
    OPTION_UI_URI = 1u << 1,    /* "format": "uri" */
};

typedef struct option_ui {
    const char *name;  /* the option, as in SPECS */
    const char *title; /* short label for a form field */
    const char *group; /* "basic" (shown first) or "advanced" (collapsed) */
    unsigned flags;    /* OPTION_UI_* */
    const char *items; /* JSON Schema of an array's items, or NULL */
} option_ui;

/* The row of option `name`, or NULL when it has none. */
const option_ui *option_ui_find(const char *name);

/* JSON array of example option objects (the schema's "examples"). */
extern const char OPTION_UI_EXAMPLES[];

#endif
