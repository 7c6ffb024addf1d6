/*
 * podnet-cni.c: the podnet CNI plugin, using libc only.
 *
 * It starts in about 1 ms, where the Python shim (shim.py) pays 25-70 ms of interpreter
 * start-up on every CNI call. Behaviour is the same as shim.py + validate.py: the same
 * local checks in the same order with the same codes and messages (only some "details"
 * are worded differently), VERSION answered locally, and the same agent protocol:
 *
 *   POST /cni HTTP/1.1 over the unix socket (config "socketPath", else
 *   $PODNET_CNI_SOCKET, else /var/run/podnet/cni-server.sock), body
 *   {"env": {every CNI_* variable}, "config": "<stdin text>"}.
 *   2xx: print the body, exit 0. Other status with a CNI error body: print it, exit 1.
 *   Agent unreachable: code 11 (50 for STATUS). Anything else: code 100 (50 for STATUS).
 *
 * One difference: the timeout ($PODNET_CNI_TIMEOUT, else per command) bounds the whole
 * exchange here, but each socket operation in the Python shim.
 *
 * Build: gcc -O2 -o podnet podnet-cni.c (podnet.cni.build does this).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_VERSION "1.1.0"
#define IMPLICIT_VERSION "0.1.0"
#define DEFAULT_SOCKET "/var/run/podnet/cni-server.sock"
/* Deeper than Python's json can go (~990), so the agent stays the judge. */
#define MAX_DEPTH 2000
#define MAX_IO ((size_t)256 << 20)

enum { E_VERSION = 1, E_ENV = 4, E_IO = 5, E_DECODE = 6, E_CONFIG = 7, E_AGAIN = 11,
       E_NOT_AVAILABLE = 50, E_BAD_ANSWER = 100, E_INTERNAL = 101 };

static const char *const SUPPORTED[] = {"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"};
#define N_SUPPORTED (sizeof SUPPORTED / sizeof SUPPORTED[0])
extern char **environ;

/* ---- growable byte buffer ---- */

typedef struct { char *p; size_t len, cap; } buf_t;

static void fail(int code, const char *msg, const char *details);

static void put(buf_t *b, const void *s, size_t n) {
    if (!b->p || b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) fail(E_INTERNAL, "internal error in podnet shim", "out of memory");
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void puts_b(buf_t *b, const char *s) { put(b, s, strlen(s)); }

/* Length of the valid UTF-8 sequence at s (strict, as Python's codec), 0 if invalid. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0], lo = 0x80, hi = 0xBF;
    size_t len;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) len = 3;
    else if (c >= 0xF0 && c <= 0xF4) len = 4;
    else return 0;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return len;
}

static int valid_utf8(const char *s, size_t n) {
    for (size_t i = 0, k; i < n; i += k)
        if (!(k = utf8_seq((const unsigned char *)s + i, n - i))) return 0;
    return 1;
}

/* Append s as a JSON string. Undecodable bytes become \udcXX, as Python's
   surrogateescape + json.dumps write them, so the agent sees the same text. */
static void put_json_string(buf_t *b, const char *s, size_t n) {
    char esc[8];
    put(b, "\"", 1);
    for (size_t i = 0, k; i < n; i += k) {
        unsigned char c = (unsigned char)s[i];
        k = utf8_seq((const unsigned char *)s + i, n - i);
        if (k == 0) {
            snprintf(esc, sizeof esc, "\\udc%02x", c);
            put(b, esc, 6);
            k = 1;
        } else if (c == '"' || c == '\\') {
            put(b, "\\", 1);
            put(b, &s[i], 1);
        } else if (c < 0x20) {
            const char *named = c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t"
                              : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
            if (!named) snprintf(esc, sizeof esc, "\\u%04x", c);
            puts_b(b, named ? named : esc);
        } else {
            put(b, &s[i], k);
        }
    }
    put(b, "\"", 1);
}

/* ---- answers ---- */

static buf_t reply_version; /* the config's cniVersion when usable, else DEFAULT_VERSION */

static void emit(buf_t *out, int status) {
    size_t off = 0;
    while (off < out->len) {
        ssize_t n = write(1, out->p + off, out->len - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) exit(1);
        off += (size_t)n;
    }
    exit(status);
}

static void fail(int code, const char *msg, const char *details) {
    static int failing;
    buf_t out = {0};
    char num[16];
    if (failing++) exit(1); /* out of memory while failing */
    puts_b(&out, "{\"cniVersion\": ");
    put_json_string(&out, reply_version.p ? reply_version.p : DEFAULT_VERSION,
                    reply_version.p ? reply_version.len : strlen(DEFAULT_VERSION));
    snprintf(num, sizeof num, "%d", code);
    puts_b(&out, ", \"code\": ");
    puts_b(&out, num);
    puts_b(&out, ", \"msg\": ");
    put_json_string(&out, msg, strlen(msg));
    puts_b(&out, ", \"details\": ");
    put_json_string(&out, details, strlen(details));
    puts_b(&out, "}\n");
    emit(&out, 1);
}

/* ---- a strict JSON parser (RFC 8259, as Python's json.loads without NaN/Infinity) ---- */

enum { K_NONE, K_STRING, K_INT, K_OTHER };
typedef struct { const char *key; int kind; buf_t str; } field_t;
typedef struct { const unsigned char *s, *end; int depth; } parser_t;

static void skip_ws(parser_t *p) {
    while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r'))
        p->s++;
}

static int hex4(const unsigned char *s, unsigned *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = s[i], d = c >= '0' && c <= '9' ? c - '0' : (c | 32) >= 'a' && (c | 32) <= 'f'
                                                                    ? (c | 32) - 'a' + 10 : 99;
        if (d == 99) return 0;
        *v = *v * 16 + d;
    }
    return 1;
}

static void put_utf8(buf_t *b, unsigned cp) {
    unsigned char u[4];
    size_t n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    static const unsigned lead[] = {0, 0, 0xC0, 0xE0, 0xF0};
    for (size_t i = n - 1; i > 0; i--, cp >>= 6) u[i] = (unsigned char)(0x80 | (cp & 63));
    u[0] = (unsigned char)(lead[n] | cp);
    put(b, u, n);
}

/* \uXXXX at p->s (after the backslash-u); combines surrogate pairs. */
static int parse_unicode_escape(parser_t *p, buf_t *out) {
    unsigned cp, lo;
    if (p->end - p->s < 4 || !hex4(p->s, &cp)) return 0;
    p->s += 4;
    if (cp >= 0xD800 && cp <= 0xDBFF && p->end - p->s >= 6 && p->s[0] == '\\' &&
        p->s[1] == 'u' && hex4(p->s + 2, &lo) && lo >= 0xDC00 && lo <= 0xDFFF) {
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        p->s += 6;
    } else if (cp >= 0xD800 && cp <= 0xDFFF) {
        cp = 0xFFFD; /* a lone surrogate: valid JSON, no UTF-8 form */
    }
    if (out) put_utf8(out, cp);
    return 1;
}

static int parse_string(parser_t *p, buf_t *out) {
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    p->s++; /* opening quote */
    while (p->s < p->end) {
        unsigned char c = *p->s++;
        if (c == '"') return 1;
        if (c < 0x20) return 0;
        if (c != '\\') {
            if (out) put(out, &c, 1);
            continue;
        }
        if (p->s >= p->end) return 0;
        c = *p->s++;
        const char *hit = c ? strchr(from, c) : NULL;
        if (hit) {
            if (out) put(out, &to[hit - from], 1);
        } else if (c != 'u' || !parse_unicode_escape(p, out)) {
            return 0;
        }
    }
    return 0;
}

static int digits(parser_t *p) {
    const unsigned char *start = p->s;
    while (p->s < p->end && *p->s >= '0' && *p->s <= '9') p->s++;
    return p->s > start;
}

static int parse_number(parser_t *p, int *kind) {
    *kind = K_INT;
    if (*p->s == '-') p->s++;
    if (p->s < p->end && *p->s == '0') p->s++;
    else if (!digits(p)) return 0;
    if (p->s < p->end && *p->s == '.') {
        p->s++;
        *kind = K_OTHER;
        if (!digits(p)) return 0;
    }
    if (p->s < p->end && (*p->s == 'e' || *p->s == 'E')) {
        p->s++;
        *kind = K_OTHER;
        if (p->s < p->end && (*p->s == '+' || *p->s == '-')) p->s++;
        if (!digits(p)) return 0;
    }
    return 1;
}

static int parse_value(parser_t *p, int *kind, buf_t *str, field_t *fields, int nfields);

/* An object (close == '}') or array; fields, when given, collect top-level members. */
static int parse_container(parser_t *p, char close, field_t *fields, int nfields) {
    buf_t key = {0};
    int kind, ok = 0;
    if (++p->depth > MAX_DEPTH) return 0;
    p->s++;
    skip_ws(p);
    if (p->s < p->end && *p->s == close) { p->s++; p->depth--; return 1; }
    for (;;) {
        field_t *f = NULL;
        if (close == '}') {
            key.len = 0;
            if (p->s >= p->end || *p->s != '"' || !parse_string(p, fields ? &key : NULL)) break;
            for (int i = 0; fields && i < nfields; i++)
                if (key.len == strlen(fields[i].key) && !memcmp(key.p, fields[i].key, key.len))
                    f = &fields[i];
            skip_ws(p);
            if (p->s >= p->end || *p->s++ != ':') break;
            skip_ws(p);
        }
        if (f) f->str.len = 0;
        if (!parse_value(p, &kind, f ? &f->str : NULL, NULL, 0)) break;
        if (f) f->kind = kind; /* duplicate keys: the last wins, as in Python */
        skip_ws(p);
        if (p->s < p->end && *p->s == close) { p->s++; ok = 1; break; }
        if (p->s >= p->end || *p->s++ != ',') break;
        skip_ws(p);
    }
    free(key.p);
    p->depth--;
    return ok;
}

static int parse_literal(parser_t *p, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(p->end - p->s) < n || memcmp(p->s, word, n)) return 0;
    p->s += n;
    return 1;
}

static int parse_value(parser_t *p, int *kind, buf_t *str, field_t *fields, int nfields) {
    *kind = K_OTHER;
    if (p->s >= p->end) return 0;
    switch (*p->s) {
    case '{': return parse_container(p, '}', fields, nfields);
    case '[': return parse_container(p, ']', NULL, 0);
    case '"': *kind = K_STRING; if (str) str->len = 0; return parse_string(p, str);
    case 't': return parse_literal(p, "true");
    case 'f': return parse_literal(p, "false");
    case 'n': return parse_literal(p, "null");
    default: return (*p->s == '-' || (*p->s >= '0' && *p->s <= '9')) && parse_number(p, kind);
    }
}

/* Parse a whole document that must be one object; fills fields. NULL on success, else
   what is wrong. */
static const char *parse_object_document(const char *s, size_t n, field_t *fields, int nfields) {
    parser_t p = {(const unsigned char *)s, (const unsigned char *)s + n, 0};
    int kind;
    if (!valid_utf8(s, n)) return "stdin is not valid UTF-8";
    skip_ws(&p);
    int is_object = p.s < p.end && *p.s == '{';
    if (!parse_value(&p, &kind, NULL, is_object ? fields : NULL, nfields)) return "invalid JSON";
    skip_ws(&p);
    if (p.s != p.end) return "invalid JSON: extra data";
    return is_object ? NULL : "network config is not a JSON object";
}

/* ---- local checks (validate.py, in its order) ---- */

enum { F_VERSION, F_NAME, F_TYPE, F_SOCKET, N_FIELDS };
static field_t config[N_FIELDS] = {
    {.key = "cniVersion"}, {.key = "name"}, {.key = "type"}, {.key = "socketPath"}};

static const char *env_nonempty(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static void check_container_id(const char *id) {
    for (const char *c = id; *c; c++) {
        int alnum = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9');
        if (alnum || (c > id && (*c == '_' || *c == '.' || *c == '-'))) continue;
        buf_t d = {0};
        puts_b(&d, "\"");
        puts_b(&d, id);
        puts_b(&d, "\" does not match ^[A-Za-z0-9][A-Za-z0-9_.-]*$");
        fail(E_ENV, "invalid CNI_CONTAINERID", d.p);
    }
}

/* Unicode White_Space, as validate.WHITESPACE. */
static int is_space(unsigned cp) {
    return (cp >= 9 && cp <= 13) || cp == ' ' || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

static const char *ifname_problem(const char *name) {
    const unsigned char *s = (const unsigned char *)name;
    size_t n = strlen(name);
    if (n > 15) return "\" is longer than 15 bytes";
    if (!strcmp(name, ".") || !strcmp(name, "..")) return "\" is . or ..";
    for (size_t i = 0, k; i < n; i += k) {
        unsigned cp = s[i];
        k = utf8_seq(s + i, n - i);
        if (k == 2) cp = (s[i] & 31u) << 6 | (s[i + 1] & 63u);
        if (k == 3) cp = (s[i] & 15u) << 12 | (s[i + 1] & 63u) << 6 | (s[i + 2] & 63u);
        if (k == 0) { k = 1; cp = 0xDC00 | s[i]; } /* as Python's surrogateescape */
        if (cp == '/' || cp == ':' || is_space(cp)) return "\" contains / or : or whitespace";
    }
    return NULL;
}

static void check_env(const char *cmd) {
    int full = !strcmp(cmd, "ADD") || !strcmp(cmd, "CHECK"), del = !strcmp(cmd, "DEL");
    if (!full && !del) return;
    const char *names[] = {"CNI_CONTAINERID", full ? "CNI_NETNS" : NULL, "CNI_IFNAME"};
    buf_t missing = {0};
    for (int i = 0; i < 3; i++) {
        if (!names[i] || env_nonempty(names[i])) continue;
        if (missing.len) puts_b(&missing, ", ");
        puts_b(&missing, names[i]);
    }
    if (missing.len) fail(E_ENV, "required environment variables missing", missing.p);
    check_container_id(getenv("CNI_CONTAINERID"));
    const char *ifname = getenv("CNI_IFNAME"), *problem = ifname_problem(ifname);
    if (problem) {
        buf_t d = {0};
        puts_b(&d, "\"");
        puts_b(&d, ifname);
        puts_b(&d, problem);
        fail(E_ENV, "invalid CNI_IFNAME", d.p);
    }
}

static int version_index(const char *v, size_t n) {
    for (size_t i = 0; i < N_SUPPORTED; i++)
        if (n == strlen(SUPPORTED[i]) && !memcmp(v, SUPPORTED[i], n)) return (int)i;
    return -1;
}

static void check_config(const char *cmd) {
    for (int i = F_VERSION; i <= F_TYPE; i++) {
        if (config[i].kind == K_NONE || config[i].kind == K_STRING) continue;
        buf_t d = {0};
        puts_b(&d, "\"");
        puts_b(&d, config[i].key);
        puts_b(&d, "\" is not a string");
        fail(E_CONFIG, "invalid network config", d.p);
    }
    field_t *v = &config[F_VERSION];
    const char *version = v->kind && v->str.len ? v->str.p : IMPLICIT_VERSION;
    size_t vlen = v->kind && v->str.len ? v->str.len : strlen(IMPLICIT_VERSION);
    int index = version_index(version, vlen);
    buf_t d = {0};
    if (index < 0) {
        puts_b(&d, "config is \"");
        put(&d, version, vlen);
        puts_b(&d, "\", plugin supports 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0");
        fail(E_VERSION, "incompatible CNI versions", d.p);
    }
    const char *since = !strcmp(cmd, "CHECK") ? "0.4.0"
                      : (!strcmp(cmd, "GC") || !strcmp(cmd, "STATUS")) ? "1.1.0" : NULL;
    if (since && index < version_index(since, strlen(since))) {
        puts_b(&d, "config version ");
        puts_b(&d, version);
        puts_b(&d, " does not allow ");
        puts_b(&d, cmd);
        puts_b(&d, " (needs ");
        puts_b(&d, since);
        puts_b(&d, " or later)");
        fail(E_VERSION, "incompatible CNI versions", d.p);
    }
    if (config[F_NAME].kind == K_NONE || !config[F_NAME].str.len)
        fail(E_CONFIG, "invalid network config", "missing \"name\"");
    if (config[F_TYPE].kind == K_NONE || !config[F_TYPE].str.len)
        fail(E_CONFIG, "invalid network config", "missing \"type\"");
}

/* ---- the exchange with the agent ---- */

static int is_status;       /* STATUS maps every agent failure to code 50 */
static const char *sock_path;

static void unreachable(const char *reason) {
    buf_t m = {0};
    puts_b(&m, "podnet agent not reachable at ");
    puts_b(&m, sock_path);
    fail(is_status ? E_NOT_AVAILABLE : E_AGAIN, m.p, reason);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void wait_for(int fd, short events, double deadline) {
    for (;;) {
        double left = deadline - now();
        if (left <= 0) unreachable("timed out");
        struct pollfd pfd = {fd, events, 0};
        int n = poll(&pfd, 1, (int)(left * 1000) + 1);
        if (n > 0) return;
        if (n < 0 && errno != EINTR) unreachable(strerror(errno));
    }
}

static int connect_agent(double deadline) {
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    size_t n = strlen(sock_path);
    if (n > sizeof addr.sun_path) unreachable("AF_UNIX path too long");
    memcpy(addr.sun_path, sock_path, n);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) unreachable(strerror(errno));
    if (connect(fd, (struct sockaddr *)&addr, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n)) < 0) {
        if (errno != EINPROGRESS) unreachable(strerror(errno));
        int err = 0;
        socklen_t len = sizeof err;
        wait_for(fd, POLLOUT, deadline);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) unreachable(strerror(err));
    }
    return fd;
}

static void send_all(int fd, const buf_t *b, double deadline) {
    for (size_t off = 0; off < b->len;) {
        wait_for(fd, POLLOUT, deadline);
        ssize_t n = send(fd, b->p + off, b->len - off, MSG_NOSIGNAL);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n < 0) unreachable(strerror(errno));
        off += (size_t)n;
    }
}

/* Header value by case-insensitive name inside the header block, or NULL. */
static const char *header(const char *head, const char *name) {
    size_t n = strlen(name);
    for (const char *line = strstr(head, "\r\n"); line && line[2]; line = strstr(line + 2, "\r\n"))
        if (!strncasecmp(line + 2, name, n) && line[2 + n] == ':') return line + 3 + n;
    return NULL;
}

/* Decode a chunked body; 1 when complete (out filled), 0 when more bytes are needed. */
static int dechunk(const char *s, size_t n, buf_t *out) {
    size_t i = 0;
    out->len = 0;
    for (;;) {
        char *end;
        const char *eol = memmem(s + i, n - i, "\r\n", 2);
        if (!eol) return 0;
        unsigned long size = strtoul(s + i, &end, 16);
        if (end == s + i || size > MAX_IO) unreachable("malformed chunked answer");
        i = (size_t)(eol - s) + 2;
        if (size == 0) return memmem(s + i - 2, n - i + 2, "\r\n\r\n", 4) != NULL;
        if (n - i < size + 2) return 0;
        put(out, s + i, size);
        i += size + 2;
    }
}

/* 1 when resp holds a whole answer; sets *status and body. */
static int parse_answer(const buf_t *resp, int eof, int *status, buf_t *body) {
    const char *end = resp->p ? strstr(resp->p, "\r\n\r\n") : NULL;
    if (!end) {
        if (eof) unreachable(resp->len ? "malformed HTTP answer" : "connection closed without an answer");
        return 0;
    }
    if (strncmp(resp->p, "HTTP/1.", 7) || sscanf(resp->p + 8, " %3d", status) != 1)
        unreachable("malformed HTTP answer");
    size_t start = (size_t)(end - resp->p) + 4, have = resp->len - start;
    buf_t head = {0};
    put(&head, resp->p, start - 2);
    const char *te = header(head.p, "Transfer-Encoding"), *cl = header(head.p, "Content-Length");
    if (te && strstr(te, "chunked")) {
        if (dechunk(resp->p + start, have, body)) return 1;
    } else if (cl) {
        size_t want = strtoull(cl, NULL, 10);
        if (have >= want) { body->len = 0; put(body, resp->p + start, want); return 1; }
    } else if (eof) {
        body->len = 0;
        put(body, resp->p + start, have);
        return 1;
    }
    if (eof) unreachable("connection closed before the answer was complete");
    return 0;
}

static void exchange(const buf_t *request, double timeout, int *status, buf_t *body) {
    double deadline = now() + timeout;
    int fd = connect_agent(deadline);
    buf_t resp = {0};
    char chunk[65536];
    send_all(fd, request, deadline);
    for (;;) {
        wait_for(fd, POLLIN, deadline);
        ssize_t n = recv(fd, chunk, sizeof chunk, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n < 0) unreachable(strerror(errno));
        if (resp.len + (size_t)n > MAX_IO) unreachable("answer too large");
        put(&resp, chunk, (size_t)n);
        if (parse_answer(&resp, n == 0, status, body)) break;
    }
    close(fd);
}

static buf_t request_for(const buf_t *stdin_text) {
    buf_t body = {0}, req = {0};
    int first = 1;
    char line[128];
    puts_b(&body, "{\"env\": {");
    for (char **e = environ; *e; e++) {
        const char *eq = strchr(*e, '=');
        if (strncmp(*e, "CNI_", 4) || !eq) continue;
        if (!first) puts_b(&body, ", ");
        first = 0;
        put_json_string(&body, *e, (size_t)(eq - *e));
        puts_b(&body, ": ");
        put_json_string(&body, eq + 1, strlen(eq + 1));
    }
    puts_b(&body, "}, \"config\": ");
    put_json_string(&body, stdin_text->p ? stdin_text->p : "", stdin_text->len);
    puts_b(&body, "}");
    snprintf(line, sizeof line, "Content-Length: %zu\r\n\r\n", body.len);
    puts_b(&req, "POST /cni HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 "Connection: close\r\n");
    puts_b(&req, line);
    put(&req, body.p, body.len);
    return req;
}

static double timeout_for(const char *cmd) {
    const char *raw = getenv("PODNET_CNI_TIMEOUT");
    char *end;
    double v = raw && *raw ? strtod(raw, &end) : 0;
    if (raw && *raw && !*end && v > 0 && v < 1e6) return v;
    if (!strcmp(cmd, "CHECK")) return 30;
    if (!strcmp(cmd, "GC")) return 120;
    if (!strcmp(cmd, "STATUS")) return 10;
    return 60;
}

static int is_cni_error(const buf_t *answer) {
    field_t code[1] = {{.key = "code"}};
    return !parse_object_document(answer->p ? answer->p : "", answer->len, code, 1) &&
           code[0].kind == K_INT;
}

static void forward(const char *cmd, const buf_t *stdin_text) {
    buf_t request = request_for(stdin_text), body = {0};
    int status = 0;
    is_status = !strcmp(cmd, "STATUS");
    exchange(&request, timeout_for(cmd), &status, &body);
    if (status >= 200 && status < 300) emit(&body, 0);
    if (is_cni_error(&body)) emit(&body, 1);
    buf_t m = {0}, d = {0};
    char num[32];
    puts_b(&m, "unexpected answer from podnet agent at ");
    puts_b(&m, sock_path);
    snprintf(num, sizeof num, "HTTP %d: ", status);
    puts_b(&d, num);
    put(&d, body.p ? body.p : "", body.len < 200 ? body.len : 200);
    fail(is_status ? E_NOT_AVAILABLE : E_BAD_ANSWER, m.p, d.p);
}

/* ---- main ---- */

static void read_stdin(buf_t *in) {
    char chunk[65536];
    for (;;) {
        ssize_t n = read(0, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EBADF) return; /* no stdin at all: like empty input */
        if (n < 0) fail(E_IO, "failed to read stdin", strerror(errno));
        if (n == 0) return;
        if (in->len + (size_t)n > MAX_IO) fail(E_IO, "failed to read stdin", "input too large");
        put(in, chunk, (size_t)n);
    }
}

static void answer_version(void) {
    buf_t out = {0};
    puts_b(&out, "{\"cniVersion\": ");
    put_json_string(&out, reply_version.p, reply_version.len);
    puts_b(&out, ", \"supportedVersions\": [");
    for (size_t i = 0; i < N_SUPPORTED; i++) {
        if (i) puts_b(&out, ", ");
        put_json_string(&out, SUPPORTED[i], strlen(SUPPORTED[i]));
    }
    puts_b(&out, "]}\n");
    emit(&out, 0);
}

int main(void) {
    static const char *const commands[] = {"ADD", "DEL", "CHECK", "STATUS", "GC", "VERSION"};
    buf_t in = {0};
    signal(SIGPIPE, SIG_IGN);
    read_stdin(&in);
    const char *decode_error = parse_object_document(in.p ? in.p : "", in.len, config, N_FIELDS);
    field_t *v = &config[F_VERSION];
    if (!decode_error && v->kind == K_STRING && v->str.len) put(&reply_version, v->str.p, v->str.len);
    else puts_b(&reply_version, DEFAULT_VERSION);

    const char *cmd = env_nonempty("CNI_COMMAND");
    int known = 0;
    if (!cmd) fail(E_ENV, "required environment variables missing", "CNI_COMMAND");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) known |= !strcmp(cmd, commands[i]);
    if (!known) fail(E_ENV, "unknown CNI_COMMAND", cmd);
    if (!strcmp(cmd, "VERSION")) answer_version();
    check_env(cmd);
    if (decode_error) fail(E_DECODE, "failed to decode network config", decode_error);
    check_config(cmd);
    field_t *s = &config[F_SOCKET];
    sock_path = s->kind == K_STRING && s->str.len ? s->str.p : env_nonempty("PODNET_CNI_SOCKET");
    if (!sock_path) sock_path = DEFAULT_SOCKET;
    forward(cmd, &in);
    return 0;
}
