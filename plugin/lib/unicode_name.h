/*
 * unicode_name.h -- names that print alike must be the same bytes.
 *
 * A persona is picked by its name's bytes, so "café" typed as one character
 * (NFC) and as "e" + U+0301 (NFD), U+212B ANGSTROM SIGN and U+00C5, or
 * "a<U+200B>b" and "ab" would be distinct personas, with distinct histories,
 * that look the same in every log and settings screen.  Such names are
 * refused rather than normalised: normalising needs Unicode's full
 * composition tables (a library Parley would carry for this alone), while
 * refusing needs only the small tables in unicode_name.c, and the host then
 * learns to send the one spelling the options use.
 *
 * What is refused (docs/options.md, `personas`):
 *  - invisible and format characters: C1 controls, soft hyphen, combining
 *    grapheme joiner, zero-width space/joiners, bidi marks, embeddings,
 *    overrides and isolates, word joiner and invisible operators, Hangul
 *    fillers, variation selectors, byte order mark, interlinear annotation,
 *    Mongolian and musical format controls, tags;
 *  - characters never in NFC (Unicode's NFC_Quick_Check=No: singletons such
 *    as U+212B, U+2126, U+212A, CJK compatibility ideographs, composition
 *    exclusions such as U+0958);
 *  - a mark that would compose with the character before it (NFC_Quick_Check
 *    =Maybe): the combining accents U+0300-U+0345 after a Latin, Greek or
 *    Cyrillic letter (or U+0338 after a relation sign), Hangul vowel and final
 *    jamo after the jamo or syllable they join, kana voicing marks after kana,
 *    and the exact pairs of the Indic, Myanmar, Balinese and Arabic marks.
 *    Marks of historic scripts beyond the BMP are not checked.
 * The letter-class rules are a little stricter than NFC ("q" + U+0301 is NFC
 * and refused): a name is a word a person types, never a test of the corner.
 */
#ifndef PARLEY_UNICODE_NAME_H
#define PARLEY_UNICODE_NAME_H

#include <stddef.h>

/* s[0..n) is UTF-8.  NULL when it may be a name, else why not (static text, then the
 * code point in *cp): "an invisible or format character", "a character that is not
 * in Unicode NFC", "a mark that composes with the character before it (not NFC)". */
const char *unicode_name_problem(const char *s, size_t n, unsigned *cp);

#endif
