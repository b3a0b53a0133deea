/* test_image.c -- image.c: base64, magic bytes, data URLs, limits, placeholders. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "lib/utf8.h"
#include "provider/image.h"

/* Plain reference encoder, for building inputs. */
static char *b64(const unsigned char *p, size_t n)
{
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *o = malloc((n + 2) / 3 * 4 + 1), *w = o;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        *w++ = A[v >> 18 & 63];
        *w++ = A[v >> 12 & 63];
        *w++ = i + 1 < n ? A[v >> 6 & 63] : '=';
        *w++ = i + 2 < n ? A[v & 63] : '=';
    }
    *w = 0;
    return o;
}

static const unsigned char PNG[] = "\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
static const unsigned char JPEG[] = "\xff\xd8\xff\xe0\0\x10JFIF";
static const unsigned char WEBP[] = "RIFF\x10\0\0\0WEBPVP8 ";
static const unsigned char GIF[] = "GIF89a\x01\0\x01\0";

static char *data_url(const char *mime, const unsigned char *p, size_t n)
{
    char *e = b64(p, n);
    char *u = pstr_printf("data:%s;base64,%s", mime, e);
    free(e);
    return u;
}

static void test_base64(void)
{
    unsigned char all[256], head[300];
    for (int i = 0; i < 256; i++)
        all[i] = (unsigned char)i;
    for (size_t n = 1; n <= 256; n++) { /* every padding case, every byte value */
        char *e = b64(all, n);
        size_t len = 0;
        CHECK(image_base64_decode(e, strlen(e), head, sizeof head, &len) == 0);
        CHECK(len == n && memcmp(head, all, n) == 0);
        free(e);
    }
    size_t len;
    unsigned char h[4];
    CHECK(image_base64_decode("QUJD", 4, h, 2, &len) == 0 && len == 3 && h[0] == 'A' && h[1] == 'B');
    const char *bad[] = {"", "QUJ", "QU=D", "Q===", "=QUJ", "QUJD\n", "QUJ$", "QQ==QUJD",
                         "QUJD QUJD", "QUJ-", "QUJ_"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(image_base64_decode(bad[i], strlen(bad[i]), h, sizeof h, &len) == -1);
    CHECK(image_base64_decode("QQ==", 4, h, sizeof h, &len) == 0 && len == 1);
    CHECK(image_base64_decode("QUI=", 4, h, sizeof h, &len) == 0 && len == 2);
}

static void test_sniff(void)
{
    CHECK_STR(image_sniff_mime(PNG, sizeof PNG - 1), "image/png");
    CHECK_STR(image_sniff_mime(JPEG, sizeof JPEG - 1), "image/jpeg");
    CHECK_STR(image_sniff_mime(WEBP, sizeof WEBP - 1), "image/webp");
    CHECK_STR(image_sniff_mime(GIF, sizeof GIF - 1), "image/gif");
    CHECK(image_sniff_mime((const unsigned char *)"hello world!", 12) == NULL);
    CHECK(image_sniff_mime(PNG, 7) == NULL); /* cut short */
    CHECK(image_sniff_mime((const unsigned char *)"RIFF\0\0\0\0WAVE", 12) == NULL);
}

/* Parse a one-image list; return the error (malloc'd) or NULL. */
static char *parse_one(const char *url, size_t max_bytes, image_list *out)
{
    image_limits lim = {max_bytes, 4};
    char *json = pstr_printf("[{\"url\": \"%s\"}]", url), *err = NULL;
    parley_status rc = image_list_parse(json, &lim, out, &err);
    free(json);
    CHECK((rc == PARLEY_OK) == (err == NULL));
    CHECK(rc == PARLEY_OK || rc == PARLEY_ERR_INVALID_INPUT);
    return err;
}

static int contains(const char *s, const char *part) { return s && strstr(s, part) != NULL; }

static void test_data_urls(void)
{
    struct { const char *mime; const unsigned char *p; size_t n; } ok[] = {
        {"image/png", PNG, sizeof PNG - 1}, {"image/jpeg", JPEG, sizeof JPEG - 1},
        {"image/webp", WEBP, sizeof WEBP - 1}, {"image/gif", GIF, sizeof GIF - 1},
    };
    for (size_t i = 0; i < 4; i++) {
        char *u = data_url(ok[i].mime, ok[i].p, ok[i].n);
        image_list l;
        char *err = parse_one(u, 1 << 20, &l);
        CHECK(err == NULL && l.n == 1);
        if (l.n == 1) {
            CHECK_STR(l.items[0].mime, ok[i].mime);
            CHECK(l.items[0].bytes == ok[i].n);
            CHECK(strcmp(l.items[0].base64, strchr(u, ',') + 1) == 0);
        }
        image_list_free(&l);
        free(u);
        free(err);
    }

    /* the type says png, the bytes are a jpeg */
    char *u = data_url("image/png", JPEG, sizeof JPEG - 1);
    image_list l;
    char *err = parse_one(u, 1 << 20, &l);
    CHECK(contains(err, "image 1: the data is image/jpeg, not image/png"));
    CHECK(l.n == 0 && l.items == NULL);
    free(u), free(err);

    u = data_url("image/png", (const unsigned char *)"not an image", 12);
    err = parse_one(u, 1 << 20, &l);
    CHECK(contains(err, "magic bytes of image/png"));
    free(u), free(err);

    u = data_url("image/svg+xml", (const unsigned char *)"<svg/>", 6);
    err = parse_one(u, 1 << 20, &l);
    CHECK(contains(err, "type \"image/svg+xml\" is not"));
    free(u), free(err);

    err = parse_one("data:image/png;base64,iVBOR!!!", 1 << 20, &l);
    CHECK(contains(err, "not valid base64"));
    free(err);
    err = parse_one("data:image/png,rawbytes", 1 << 20, &l);
    CHECK(contains(err, "data:<image type>;base64,<data>"));
    free(err);

    /* max_image_bytes counts decoded bytes: exactly the limit passes, one more does not */
    u = data_url("image/png", PNG, sizeof PNG - 1);
    err = parse_one(u, sizeof PNG - 1, &l);
    CHECK(err == NULL);
    image_list_free(&l);
    free(err);
    err = parse_one(u, sizeof PNG - 2, &l);
    CHECK(contains(err, "more than max_image_bytes (15)"));
    free(u), free(err);
}

static void test_urls_and_list(void)
{
    image_list l;
    char *err = parse_one("https://example.com/door.jpg", 100, &l);
    CHECK(err == NULL && l.n == 1 && l.items[0].mime == NULL && l.items[0].base64 == NULL);
    pbuf b = PBUF_INIT;
    image_placeholder(&b, &l.items[0]);
    CHECK_STR(b.data, "[image: https://example.com/door.jpg]");
    CHECK(!image_url_has_secrets(&l.items[0]));
    image_list_free(&l);

    /* credentials and tokens never reach the placeholder */
    const char *secret[][2] = {
        {"https://user:pw@ha.local/api/camera_proxy/camera.door?token=abc123",
         "[image: https://ha.local/api/camera_proxy/camera.door]"},
        {"https://u:p@ss@ha.local:8123/x.jpg#frag", "[image: https://ha.local:8123/x.jpg]"},
        {"http://ha.local?token=t", "[image: http://ha.local]"},
        {"https://ha.local/a@b.jpg?x=1", "[image: https://ha.local/a@b.jpg]"},
    };
    for (size_t i = 0; i < sizeof secret / sizeof secret[0]; i++) {
        err = parse_one(secret[i][0], 100, &l);
        CHECK(err == NULL && l.n == 1 && image_url_has_secrets(&l.items[0]));
        pbuf_reset(&b);
        image_placeholder(&b, &l.items[0]);
        CHECK_STR(b.data, secret[i][1]);
        image_list_free(&l);
    }
    pbuf_reset(&b);

    err = parse_one("ftp://example.com/a.png", 100, &l);
    CHECK(contains(err, "image 1: the URL must be data:, http: or https: (not ftp:)"));
    free(err);
    err = parse_one("file:///etc/passwd", 100, &l);
    CHECK(contains(err, "(not file:)"));
    free(err);
    err = parse_one("https:///nohost", 100, &l);
    CHECK(contains(err, "no host"));
    free(err);

    image_limits lim = {100, 2};
    const char *bad[][2] = {
        {"{\"url\": \"https://a/b\"}", "must be a JSON array"},
        {"[1]", "image 1: must be {\"url\""},
        {"[{\"url\": \"https://a/b\", \"detail\": \"high\"}]", "image 1: must be"},
        {"[{\"url\": \"https://a/b\"}, {\"url\": \"gopher://x\"}]", "image 2: the URL must be"},
        /* a good image, then a bad shape: the fuzzer's find (the first image's check had set OK) */
        {"[{\"url\": \"https://a/b\"}, {\"urlda\": \"ftp://x\"}]", "image 2: must be {\"url\""},
        {"[{\"url\":\"https://a\"},{\"url\":\"https://b\"},{\"url\":\"https://c\"}]",
         "3 images, more than max_images_per_turn (2)"},
        {"[", "must be a JSON array"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err = NULL;
        CHECK(image_list_parse(bad[i][0], &lim, &l, &err) == PARLEY_ERR_INVALID_INPUT);
        CHECK(contains(err, bad[i][1]));
        if (!contains(err, bad[i][1]))
            fprintf(stderr, "  input %s -> %s\n", bad[i][0], err ? err : "(null)");
        CHECK(l.n == 0);
        free(err);
    }
    CHECK(image_list_parse("[]", &lim, &l, &err) == PARLEY_OK && l.n == 0);

    image im = {.mime = "image/jpeg", .bytes = 187392};
    pbuf_reset(&b);
    image_placeholder(&b, &im);
    CHECK_STR(b.data, "[image: image/jpeg, 183 KB]");
    im.bytes = 900;
    pbuf_reset(&b);
    image_placeholder(&b, &im);
    CHECK_STR(b.data, "[image: image/jpeg, 900 bytes]");
    pbuf_free(&b);
}

/* What the refusal quotes of a URL (its scheme, a data URL's type) is cut at a character,
   never inside one (the fuzzer's find: "...680\xc9" of "...680\xc9\x9a:/gn"). */
static void test_quotes_are_utf8(void)
{
    static const struct {
        const char *url, *want;
    } cases[] = {
        {"Adat92#33720680\xc9\x9a:/gn", "(not Adat92#33720680...:)"},
        {"caf\xc3\xa9:x", "(not caf\xc3\xa9:)"},
        {"data:image/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\xe2\x82\xac;base64,AA",
         "type \"image/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        image_list l;
        char *err = parse_one(cases[i].url, 1 << 20, &l);
        CHECK(err && utf8_valid(err, strlen(err)) && contains(err, cases[i].want));
        if (!contains(err, cases[i].want))
            fprintf(stderr, "  %s -> %s\n", cases[i].url, err ? err : "(null)");
        free(err);
        image_list_free(&l);
    }
}

int main(void)
{
    test_quotes_are_utf8();
    test_base64();
    test_sniff();
    test_data_urls();
    test_urls_and_list();
    return check_report();
}
