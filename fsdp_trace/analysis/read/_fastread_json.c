/* The JSON side of the compiled reader (#included by _fastread.c: one translation unit, so
 * that these stay static and inline where the compiler likes): growable byte buffers, string
 * intern tables, and a scanner of JSON strings, numbers and skipped values that checks the
 * grammar as it goes and declines (Scan.bail) what it does not read exactly as msgspec does.
 * Written for this project; CPython's C API only.
 *
 * The scan runs with the GIL released (`Reader.parse`), so nothing here touches a Python
 * object or raises: memory comes from PyMem_Raw*, and an error is noted in `pending_error`
 * (this thread's), which the caller raises once it holds the GIL again. */

#if defined(_MSC_VER)
#define THREAD_LOCAL __declspec(thread)
#else
#define THREAD_LOCAL _Thread_local
#endif

enum { NO_ERROR, ERROR_MEMORY, ERROR_TOO_MANY_STRINGS };
static THREAD_LOCAL int pending_error = NO_ERROR;

/* The error noted while the GIL was released, raised (the GIL held); -1 if there was one. */
static int raise_pending(void) {
    int e = pending_error;
    pending_error = NO_ERROR;
    if (e == ERROR_MEMORY) PyErr_NoMemory();
    else if (e == ERROR_TOO_MANY_STRINGS)
        PyErr_SetString(PyExc_OverflowError, "too many distinct strings");
    return e == NO_ERROR ? 0 : -1;
}

/* ------------------------------------------------------------------ growable bytes */

typedef struct {
    char *p;
    size_t n, cap;
} Buf;

static int buf_reserve(Buf *b, size_t extra) {
    if (b->n + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra) cap *= 2;
    char *p = PyMem_RawRealloc(b->p, cap);
    if (p == NULL) {
        pending_error = ERROR_MEMORY;
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static int buf_put(Buf *b, const void *data, size_t n) {
    if (n == 0) return 0;
    if (buf_reserve(b, n) < 0) return -1;
    memcpy(b->p + b->n, data, n);
    b->n += n;
    return 0;
}

static void buf_free(Buf *b) {
    PyMem_RawFree(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* ------------------------------------------------------------------ intern tables */

typedef struct {
    uint64_t hash;
    size_t off, len; /* the bytes, in the table's store */
    PyObject *str;   /* made on first need */
    int used;        /* handed to the caller as a new name already (name tables) */
    uint32_t mark;   /* the last column of a piece that named it (`piece_strings`) */
    int32_t local;   /* its place in that column's list of strings */
} Entry;

typedef struct {
    Entry *entries;
    Py_ssize_t count, cap;
    int32_t *slots; /* open addressing: entry index, -1 empty */
    size_t nslots;  /* a power of 2, at least twice count */
    Buf store;
} Table;

static uint64_t hash_bytes(const uchar *s, size_t n) {
    uint64_t h = 1469598103934665603ULL ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 1099511628211ULL;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ s[i]) * 1099511628211ULL;
    h ^= h >> 32;
    return h;
}

static void table_free(Table *t) {
    for (Py_ssize_t i = 0; i < t->count; i++) Py_XDECREF(t->entries[i].str);
    PyMem_RawFree(t->entries);
    PyMem_RawFree(t->slots);
    buf_free(&t->store);
    memset(t, 0, sizeof(*t));
}

static int table_grow(Table *t) {
    size_t nslots = t->nslots ? t->nslots * 2 : 64;
    int32_t *slots = PyMem_RawMalloc(nslots * sizeof(int32_t));
    if (slots == NULL) {
        pending_error = ERROR_MEMORY;
        return -1;
    }
    memset(slots, 0xff, nslots * sizeof(int32_t));
    for (Py_ssize_t i = 0; i < t->count; i++) {
        size_t j = t->entries[i].hash & (nslots - 1);
        while (slots[j] >= 0) j = (j + 1) & (nslots - 1);
        slots[j] = (int32_t)i;
    }
    PyMem_RawFree(t->slots);
    t->slots = slots;
    t->nslots = nslots;
    return 0;
}

/* The id of `s` in `t`, added if new; -1 on error (noted in pending_error). */
static int32_t table_id(Table *t, const uchar *s, size_t n) {
    if ((size_t)(t->count + 1) * 2 > t->nslots && table_grow(t) < 0) return -1;
    uint64_t h = hash_bytes(s, n);
    size_t j = h & (t->nslots - 1);
    for (;;) {
        int32_t k = t->slots[j];
        if (k < 0) break;
        Entry *e = &t->entries[k];
        if (e->hash == h && e->len == n && (n == 0 || memcmp(t->store.p + e->off, s, n) == 0))
            return k;
        j = (j + 1) & (t->nslots - 1);
    }
    if (t->count >= INT32_MAX - 1) {
        pending_error = ERROR_TOO_MANY_STRINGS;
        return -1;
    }
    if (t->count == t->cap) {
        Py_ssize_t cap = t->cap ? t->cap * 2 : 64;
        Entry *entries = PyMem_RawRealloc(t->entries, cap * sizeof(Entry));
        if (entries == NULL) {
            pending_error = ERROR_MEMORY;
            return -1;
        }
        t->entries = entries;
        t->cap = cap;
    }
    size_t off = t->store.n;
    if (buf_put(&t->store, s, n) < 0) return -1;
    Entry *e = &t->entries[t->count];
    e->hash = h;
    e->off = off;
    e->len = n;
    e->str = NULL;
    e->used = 0;
    e->mark = 0;
    t->slots[j] = (int32_t)t->count;
    return (int32_t)t->count++;
}

/* The entry's text as a str (made once; a new reference); NULL with an exception set when
 * the bytes are not UTF-8. */
static PyObject *table_str(Table *t, int32_t k) {
    Entry *e = &t->entries[k];
    if (e->str == NULL) {
        e->str = PyUnicode_DecodeUTF8(t->store.p + e->off, (Py_ssize_t)e->len, "strict");
        if (e->str == NULL) return NULL;
    }
    Py_INCREF(e->str);
    return e->str;
}

/* ------------------------------------------------------------------ the scanner */

typedef struct {
    const uchar *p, *end;
    int bail;                /* declined: not the plain case */
    PyThreadState *released; /* the GIL's holder while it is released, else NULL */
} Scan;

static inline void skip_ws(Scan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t'))
        s->p++;
}

static inline int at(Scan *s, uchar c) { return s->p < s->end && *s->p == c; }

static int hexval(uchar c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int read_hex4(const uchar *p) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p[i]);
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

/* Whether `n` bytes are UTF-8 (strict: no overlong forms, no surrogates, none past U+10FFFF).
 * The text is checked before it gets here; this keeps the reader right on its own. */
static int utf8_valid(const uchar *p, size_t n) {
    const uchar *end = p + n;
    while (p < end) {
        uchar c = *p;
        if (c < 0x80) {
            p++;
            continue;
        }
        size_t k;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) k = 1, cp = c & 0x1F;
        else if (c >= 0xE0 && c <= 0xEF) k = 2, cp = c & 0x0F;
        else if (c >= 0xF0 && c <= 0xF4) k = 3, cp = c & 0x07;
        else return 0;
        if ((size_t)(end - p) <= k) return 0;
        for (size_t i = 1; i <= k; i++) {
            if ((p[i] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (p[i] & 0x3F);
        }
        if ((k == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (k == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return 0;
        p += k + 1;
    }
    return 1;
}

static int ascii_only(const uchar *p, size_t n) {
    uchar any = 0;
    for (size_t i = 0; i < n; i++) any |= p[i];
    return any < 0x80;
}

/* The first quote, backslash or control character in [p, end), or end; *high collects the
 * bytes' high bits (non-zero: not ASCII). Eight bytes at a time: Kineto's names are long. */
#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL
static inline const uchar *string_stop(const uchar *p, const uchar *end, uint64_t *high) {
    uint64_t acc = 0;
    while (end - p >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        uint64_t q = w ^ (ONES * '"'), b = w ^ (ONES * '\\');
        uint64_t hit = ((q - ONES) & ~q) | ((b - ONES) & ~b) | ((w - ONES * 0x20) & ~w);
        if (hit & HIGHS) break;
        acc |= w;
        p += 8;
    }
    while (p < end && *p != '"' && *p != '\\' && *p >= 0x20) acc |= *p++;
    *high = acc & HIGHS;
    return p;
}

/* A string at s->p (its opening quote). Its text: a span of the input when it has no escapes
 * (*out, *n), else decoded into `scratch`. Returns 0, or -1 (bail set, or an error noted). The
 * input is UTF-8 (checked before it gets here); escapes must not make lone surrogates. */
static int scan_string(Scan *s, const uchar **out, size_t *n, Buf *scratch, int *escaped) {
    const uchar *p = s->p + 1, *end = s->end;
    const uchar *start = p;
    uint64_t high;
    p = string_stop(p, end, &high);
    if (p < end && *p == '"') {
        *out = start;
        *n = (size_t)(p - start);
        if (high && !utf8_valid(start, *n)) {
            s->bail = 1;
            return -1;
        }
        if (escaped) *escaped = 0;
        s->p = p + 1;
        return 0;
    }
    if (p >= end || *p < 0x20 || scratch == NULL) {
        s->bail = 1;
        return -1;
    }
    /* escapes: decode */
    scratch->n = 0;
    if (buf_put(scratch, start, (size_t)(p - start)) < 0) return -1;
    while (p < end) {
        uchar c = *p;
        if (c == '"') break;
        if (c < 0x20) {
            s->bail = 1;
            return -1;
        }
        if (c != '\\') {
            const uchar *q = p;
            while (q < end && *q != '"' && *q != '\\' && *q >= 0x20) q++;
            if (buf_put(scratch, p, (size_t)(q - p)) < 0) return -1;
            p = q;
            continue;
        }
        if (p + 1 >= end) {
            s->bail = 1;
            return -1;
        }
        uchar e = p[1];
        char one;
        switch (e) {
            case '"': one = '"'; break;
            case '\\': one = '\\'; break;
            case '/': one = '/'; break;
            case 'b': one = '\b'; break;
            case 'f': one = '\f'; break;
            case 'n': one = '\n'; break;
            case 'r': one = '\r'; break;
            case 't': one = '\t'; break;
            case 'u': one = 0; break;
            default: s->bail = 1; return -1;
        }
        if (e != 'u') {
            if (buf_put(scratch, &one, 1) < 0) return -1;
            p += 2;
            continue;
        }
        if (p + 6 > end) {
            s->bail = 1;
            return -1;
        }
        int cp = read_hex4(p + 2);
        if (cp < 0) {
            s->bail = 1;
            return -1;
        }
        p += 6;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (p + 6 > end || p[0] != '\\' || p[1] != 'u') {
                s->bail = 1;
                return -1;
            }
            int lo = read_hex4(p + 2);
            if (lo < 0xDC00 || lo > 0xDFFF) {
                s->bail = 1;
                return -1;
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            p += 6;
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            s->bail = 1;
            return -1;
        }
        uchar u[4];
        size_t k;
        if (cp < 0x80) {
            u[0] = (uchar)cp;
            k = 1;
        } else if (cp < 0x800) {
            u[0] = (uchar)(0xC0 | (cp >> 6));
            u[1] = (uchar)(0x80 | (cp & 0x3F));
            k = 2;
        } else if (cp < 0x10000) {
            u[0] = (uchar)(0xE0 | (cp >> 12));
            u[1] = (uchar)(0x80 | ((cp >> 6) & 0x3F));
            u[2] = (uchar)(0x80 | (cp & 0x3F));
            k = 3;
        } else {
            u[0] = (uchar)(0xF0 | (cp >> 18));
            u[1] = (uchar)(0x80 | ((cp >> 12) & 0x3F));
            u[2] = (uchar)(0x80 | ((cp >> 6) & 0x3F));
            u[3] = (uchar)(0x80 | (cp & 0x3F));
            k = 4;
        }
        if (buf_put(scratch, u, k) < 0) return -1;
    }
    if (p >= end) {
        s->bail = 1;
        return -1;
    }
    if (!ascii_only((const uchar *)scratch->p, scratch->n) &&
        !utf8_valid((const uchar *)scratch->p, scratch->n)) {
        s->bail = 1;
        return -1;
    }
    *out = (const uchar *)scratch->p;
    *n = scratch->n;
    if (escaped) *escaped = 1;
    s->p = p + 1;
    return 0;
}

/* A JSON number at s->p, its grammar checked. is_int: no fraction, no exponent. For an
 * integer, *i (ok_int: it fits int64); *d (want_double): its value as a double, correctly
 * rounded: one exact operation where both operands are exact (Clinger's fast path), else an
 * integer division for up to 19 digits and 19 decimals (`exact_quotient`), else CPython's
 * dtoa, the GIL taken back for it. */
typedef struct {
    int is_int, ok_int;
    int64_t i;
    double d;
    const uchar *start;
    size_t len;
} Num;

static const double POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                 1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* m / 10^k (1 <= k <= 19) correctly rounded to a double, with integers alone (so without the
 * GIL): the quotient taken to at least 55 bits, then rounded to 53, half to even, the
 * remainder deciding a tie. What Kineto writes past Clinger's fast path: microseconds since
 * boot with three decimals, 16-19 digits (a machine up more than ~104 days). 0 where there
 * is no 128-bit integer type (the caller converts it otherwise). */
static int exact_quotient(uint64_t m, int k, double *out) {
#if defined(__SIZEOF_INT128__)
    if (m == 0) {
        *out = 0.0;
        return 1;
    }
    uint64_t d = 1;
    for (int i = 0; i < k; i++) d *= 10;
    int mbits = 64 - __builtin_clzll(m), dbits = 64 - __builtin_clzll(d);
    int shift = 55 + dbits - mbits; /* the quotient then has 55 or 56 bits */
    if (shift < 0) shift = 0;       /* it has more: still at most 64 */
    unsigned __int128 n = (unsigned __int128)m << shift;
    uint64_t q = (uint64_t)(n / d);
    int sticky = (n % d) != 0;
    int qbits = 64 - __builtin_clzll(q);
    int drop = qbits - 53; /* at least 2 */
    uint64_t mant = q >> drop, rest = q & ((1ULL << drop) - 1), half = 1ULL << (drop - 1);
    if (rest > half || (rest == half && (sticky || (mant & 1)))) {
        mant++;
        if (mant == (1ULL << 53)) {
            mant >>= 1;
            drop++;
        }
    }
    *out = ldexp((double)mant, drop - shift);
    return 1;
#else
    (void)m;
    (void)k;
    (void)out;
    return 0;
#endif
}

static int scan_number(Scan *s, Num *num, int want_double) {
    const uchar *p = s->p, *end = s->end;
    num->start = p;
    int neg = 0;
    if (p < end && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= end || *p < '0' || *p > '9') {
        s->bail = 1;
        return -1;
    }
    uint64_t m = 0; /* the first 19 significant digits */
    int sig = 0;     /* digits in m */
    int inexact = 0; /* significant digits past the 19th */
    int e10 = 0;     /* m * 10^e10 (before the exponent part) */
    if (*p == '0') {
        p++;
        if (p < end && *p >= '0' && *p <= '9') { /* a leading zero */
            s->bail = 1;
            return -1;
        }
    } else {
        for (; p < end && *p >= '0' && *p <= '9'; p++) {
            if (sig < 19) {
                m = m * 10 + (uint64_t)(*p - '0');
                sig++;
            } else {
                inexact = 1;
                e10++;
            }
        }
    }
    int is_int = 1;
    if (p < end && *p == '.') {
        is_int = 0;
        p++;
        if (p >= end || *p < '0' || *p > '9') {
            s->bail = 1;
            return -1;
        }
        for (; p < end && *p >= '0' && *p <= '9'; p++) {
            if (sig == 0 && *p == '0') {
                e10--; /* a leading zero of the fraction */
            } else if (sig < 19) {
                m = m * 10 + (uint64_t)(*p - '0');
                sig++;
                e10--;
            } else {
                inexact = 1;
            }
        }
    }
    int exp = 0;
    if (p < end && (*p == 'e' || *p == 'E')) {
        is_int = 0;
        p++;
        int eneg = 0;
        if (p < end && (*p == '+' || *p == '-')) {
            eneg = *p == '-';
            p++;
        }
        if (p >= end || *p < '0' || *p > '9') {
            s->bail = 1;
            return -1;
        }
        for (; p < end && *p >= '0' && *p <= '9'; p++) {
            exp = exp * 10 + (*p - '0');
            if (exp >= 10000) { /* msgspec reads at most 4 digits' worth: left to it */
                s->bail = 1;
                return -1;
            }
        }
        if (eneg) exp = -exp;
    }
    if (p - num->start > MAX_NUMBER) { /* no trace writes such a number: left to msgspec */
        s->bail = 1;
        return -1;
    }
    e10 += exp;
    num->len = (size_t)(p - num->start);
    num->is_int = is_int;
    num->ok_int = 0;
    s->p = p;
    if (is_int && !inexact) {
        if (!neg && m <= (uint64_t)INT64_MAX) {
            num->ok_int = 1;
            num->i = (int64_t)m;
        } else if (neg && m <= (uint64_t)INT64_MAX + 1) {
            num->ok_int = 1;
            num->i = m == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)m;
        }
    }
    if (!want_double) return 0;
    if (!inexact && m <= (1ULL << 53) && e10 >= -22 && e10 <= 22) {
        /* both operands exact: one correctly rounded operation (Clinger's fast path) */
        double v = (double)m;
        v = e10 < 0 ? v / POW10[-e10] : v * POW10[e10];
        num->d = neg ? -v : v;
        return 0;
    }
    if (!inexact && e10 < 0 && e10 >= -19 && exact_quotient(m, -e10, &num->d)) {
        if (neg) num->d = -num->d;
        return 0;
    }
    /* Anything else (more than 19 digits, a large exponent): CPython's dtoa, correctly
     * rounded and locale-free, which needs the GIL (its big numbers share a free list). */
    char text[MAX_NUMBER + 1];
    memcpy(text, num->start, num->len);
    text[num->len] = 0;
    if (s->released) PyEval_RestoreThread(s->released);
    char *stop = NULL;
    double v = PyOS_string_to_double(text, &stop, NULL);
    int failed = v == -1.0 && PyErr_Occurred();
    if (failed) PyErr_Clear();
    if (s->released) s->released = PyEval_SaveThread();
    if (failed || stop != text + num->len || v > 1.7976931348623157e308 ||
        v < -1.7976931348623157e308) {
        s->bail = 1; /* out of range: left to the msgspec path */
        return -1;
    }
    num->d = v;
    return 0;
}

/* Any JSON value, skipped (its grammar checked). */
static int skip_value(Scan *s, int depth) {
    if (depth > MAX_DEPTH) {
        s->bail = 1;
        return -1;
    }
    skip_ws(s);
    if (s->p >= s->end) {
        s->bail = 1;
        return -1;
    }
    uchar c = *s->p;
    if (c == '"') {
        const uchar *out;
        size_t n;
        /* escapes checked, not decoded */
        const uchar *p = s->p + 1, *end = s->end;
        for (;;) {
            uint64_t high;
            p = string_stop(p, end, &high);
            if (p >= end || *p < 0x20) {
                s->bail = 1;
                return -1;
            }
            if (*p == '"') {
                const uchar *q = s->p + 1;
                if (high && !utf8_valid(q, (size_t)(p - q))) {
                    s->bail = 1;
                    return -1;
                }
                break;
            }
            /* an escape: let the decoder check it */
            Buf tmp = {0};
            int r = scan_string(s, &out, &n, &tmp, NULL);
            buf_free(&tmp);
            return r;
        }
        s->p = p + 1;
        return 0;
    }
    if (c == '{' || c == '[') {
        uchar close = c == '{' ? '}' : ']';
        s->p++;
        skip_ws(s);
        if (at(s, close)) {
            s->p++;
            return 0;
        }
        for (;;) {
            if (c == '{') {
                skip_ws(s);
                if (!at(s, '"')) {
                    s->bail = 1;
                    return -1;
                }
                if (skip_value(s, depth + 1) < 0) return -1;
                skip_ws(s);
                if (!at(s, ':')) {
                    s->bail = 1;
                    return -1;
                }
                s->p++;
            }
            if (skip_value(s, depth + 1) < 0) return -1;
            skip_ws(s);
            if (at(s, ',')) {
                s->p++;
                continue;
            }
            if (at(s, close)) {
                s->p++;
                return 0;
            }
            s->bail = 1;
            return -1;
        }
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        Num num;
        return scan_number(s, &num, 0);
    }
    static const char *words[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(words[i]);
        if ((size_t)(s->end - s->p) >= n && memcmp(s->p, words[i], n) == 0) {
            s->p += n;
            return 0;
        }
    }
    s->bail = 1;
    return -1;
}

static int is_null(Scan *s) {
    if (s->end - s->p >= 4 && memcmp(s->p, "null", 4) == 0) {
        s->p += 4;
        return 1;
    }
    return 0;
}

